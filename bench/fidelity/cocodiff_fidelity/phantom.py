"""cocodiff's phantom runs as the fidelity scripts predict a measurement with them: one
FLUX.1-dev step on one node of W GPUs (steps, breakdowns, profiles, chunks, pace, host), and one
forward of any model on one GPU (models_fidelity.py, fit_inductor.py)."""
import json
import os
import subprocess
import sys
import tempfile

from . import paths

# Each strategy of measure_multi.py's steps as cocodiff's run.strategy runs it: plain all-to-alls
# (flat), with V-First, with pipelining (2 head groups) and with both (cocodiff without V-Major).
STRATEGY = {"flat": "flat", "v_first": "flat+v_first", "pipeline": "flat+pipeline",
            "cocodiff": "flat+v_first+pipeline"}

# The families whose pipeline batches the conditional and unconditional passes into one forward.
BATCH_CFG = {"sd3", "dit"}


def step_sets(w, res, strategy, steps, trace=False):
    """The --set assignments of `steps` phantom FLUX.1-dev steps at res^2 under run.strategy =
    STRATEGY on one node of w GPUs, a NIC each."""
    nics = ",".join(str(i) for i in range(w))
    return ["run.math=skip", "model.preset=flux1-dev", f"run.resolution={res}", f"run.steps={steps}",
            "cluster.nodes=1", f"cluster.topology.sizes=[{w}]", f"cluster.nic.count={w}",
            f"cluster.nic.rank_nic=[{nics}]", f"run.strategy={strategy}", f"emulator.trace={str(trace).lower()}"]


def run_command(cocodiff, out, sets):
    """`cocodiff run configs/quickstart.toml --out OUT -q --set S ...` as a list."""
    cmd = [cocodiff, "run", paths.QUICKSTART, "--out", out, "-q"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_phantom_step(cocodiff, w, res, strategy, steps, sets, trace=False):
    """report.json of `steps` FLUX.1-dev steps at res^2 under run.strategy=`strategy` on one node
    of w GPUs (a NIC each), with the extra `sets` (KEY=VALUE); with `trace`, also its trace's
    events (trace.json) under "trace_events". Exits naming the command if cocodiff fails."""
    with tempfile.TemporaryDirectory() as d:
        cmd = run_command(cocodiff, d, step_sets(w, res, strategy, steps, trace) + list(sets))
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"cocodiff failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}")
        with open(os.path.join(d, "report.json")) as f:
            report = json.load(f)
        if trace:
            with open(os.path.join(d, "trace.json")) as f:
                report["trace_events"] = json.load(f)["traceEvents"]
        return report


def preset_for(machine, transport):
    """The cluster preset that predicts a measurement directory's steps over `transport`: H200s
    hgx-h200 over NVLink and h200-shm over shared memory, H100s hgx-h100 and h100-shm."""
    if machine.startswith("h200"):
        return "hgx-h200" if transport == "nvlink" else "h200-shm"
    return "hgx-h100" if transport == "nvlink" else "h100-shm"


def forward_sets(preset, row, framework="reference", extra=()):
    """The --set assignments of one phantom forward of a forwards.csv row (model, width, height,
    batch, frames) on one GPU of PRESET; None when cocodiff runs no such forward (batch 2 of a
    family that does not batch its guidance)."""
    batch = int(row["batch"])
    if batch == 2 and row["family"] not in BATCH_CFG:
        return None
    w, h = int(row["width"]), int(row["height"])
    frames = int(row.get("frames") or 1)  # video frames (older files: images only)
    sets = [f"model.preset={row['model']}", f"cluster.preset={preset}", "cluster.nodes=1",
            "cluster.topology.sizes=[1]", "cluster.nic.rank_nic=[0]", "run.strategy=serial",
            "run.math=skip", "run.steps=1", "emulator.trace=false", "emulator.workers=1",
            f"cluster.device.host.framework={framework}", *extra]
    sets += [f"run.resolution={w}"] if w == h else [f"run.width={w}", f"run.height={h}"]
    if batch == 1:
        sets.append("run.cfg_scale=1")
    if frames > 1:
        sets.append(f"run.frames={frames}")
    return sets


def predict_forward(cocodiff, preset, row, cache, framework="reference", extra=()):
    """cocodiff's virtual time of the row's forward in ms, or None when it runs no such forward.
    EXTRA: further --set assignments (a fit's trial values). CACHE: a dict kept between calls."""
    w, h = int(row["width"]), int(row["height"])
    key = (row["model"], w, h, int(row["batch"]), int(row.get("frames") or 1), framework, tuple(extra))
    if key in cache:
        return cache[key]
    sets = forward_sets(preset, row, framework, extra)
    if sets is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        subprocess.run(run_command(cocodiff, out, sets), check=True)
        with open(os.path.join(out, "report.json")) as f:
            report = json.load(f)
    cache[key] = report["virtual_time_s"] * 1e3
    return cache[key]
