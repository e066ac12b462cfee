"""One phantom FLUX.1-dev run of cocodiff on one node of W GPUs, as the fidelity scripts predict
a measured step with it: steps_fidelity.py (whole steps), breakdown_fidelity.py (their
breakdowns) and profile_fidelity.py (profiled steps) call it with the cluster keys each needs."""
import csv, glob, json, os, subprocess, sys, tempfile

# Each strategy of measure_multi.py's steps as cocodiff's run.strategy runs it: plain all-to-alls
# (flat), with V-First, with pipelining (2 head groups) and with both (cocodiff without V-Major).
STRATEGY = {"flat": "flat", "v_first": "flat+v_first", "pipeline": "flat+pipeline",
            "cocodiff": "flat+v_first+pipeline"}


def run_phantom_step(cocodiff, root, w, res, strategy, steps, sets, trace=False):
    """report.json of `steps` FLUX.1-dev steps at res^2 under run.strategy=`strategy` on one node
    of w GPUs (a NIC each), with the extra `sets` (KEY=VALUE); with `trace`, also its trace's
    events (trace.json) under "trace_events". Exits naming the command if cocodiff fails."""
    nics = ",".join(str(i) for i in range(w))
    base = ["run.math=skip", "model.preset=flux1-dev", f"run.resolution={res}", f"run.steps={steps}",
            "cluster.nodes=1", f"cluster.topology.sizes=[{w}]", f"cluster.nic.count={w}",
            f"cluster.nic.rank_nic=[{nics}]", f"run.strategy={strategy}", f"emulator.trace={str(trace).lower()}"]
    with tempfile.TemporaryDirectory() as d:
        cmd = [cocodiff, "run", os.path.join(root, "configs/quickstart.toml"), "--out", d, "-q"]
        for s in base + list(sets):
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"cocodiff failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}")
        report = json.load(open(os.path.join(d, "report.json")))
        if trace:
            report["trace_events"] = json.load(open(os.path.join(d, "trace.json")))["traceEvents"]
        return report


def preset_for(machine, transport):
    """The cluster preset that predicts a measurement directory's steps over `transport`: H200s
    hgx-h200 over NVLink and h200-shm over shared memory, H100s hgx-h100 and h100-shm."""
    if machine.startswith("h200"):
        return "hgx-h200" if transport == "nvlink" else "h200-shm"
    return "hgx-h100" if transport == "nvlink" else "h100-shm"


def read_steps(root, machines="h[12]00x*"):
    """Every measured step of configs/measurements/MACHINES/steps_*.csv: {(machine, transport,
    gpus, resolution, strategy): [median_ms of each row]} (a step measured in several launches
    has a row from each)."""
    measured = {}
    for path in sorted(glob.glob(os.path.join(root, "configs/measurements", machines, "steps_*.csv"))):
        machine = os.path.basename(os.path.dirname(path))
        for r in csv.DictReader(open(path)):
            measured.setdefault((machine, r["transport"], int(r["gpus"]), int(r["resolution"]), r["strategy"]),
                                []).append(float(r["median_ms"]))
    return measured
