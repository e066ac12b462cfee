#!/usr/bin/env python3
"""Profiled FLUX.1-dev steps (every kernel's device time) against the emulator's steps.

For every case of configs/measurements/h[12]00x*/profile_<transport>.json (measure_multi.py
--parts profile) runs the same step in the emulator (phantom mode, FLUX.1-dev on one node of W
GPUs: NVLink hgx-h100, shared memory h100-shm, H200 hgx-h200 and h200-shm; strategies as steps_fidelity.py runs
them) and prints, in ms a step:
  step        measured without the profiler (steps_<transport>.csv of the same directory, else
              the profiled step) / predicted;
  gain        flat's step less this strategy's, measured / predicted;
  compute     the compute kernels' device time, least and most over the ranks, and what overlap
              and chunking add to it over flat's (mean rank), against the model's mean compute
              per tile and what it adds over flat;
  nccl        NCCL's kernels on the rank that has the least of them (the kernels' own time: the
              others also hold waits for their peers), and what they add over flat.
A second table brackets the overlap slowdown's window: what each strategy adds to flat's compute,
measured (least and most over the machines) against the model as it runs (compute beside a
collective slowed from the collective's start to its wait) and with no slowdown at all (the
device's overlap compute factors at 1). A slowdown that lasted only to the transfer's end would
fall between the two: "between" says such a window could meet the measurement, "above" that the
measured cost exceeds even the whole window's, "below" that it is less than the chunking alone;
"share" is how much of the window's slowdown the measurement (its middle) takes.

Usage: profile_fidelity.py COCODIFF [--out DIR] [--set KEY=VALUE ...]
Writes DIR/profile_fidelity.{txt,json} (default bench/fidelity/results).
"""
import functools, json, os, tomllib

from cocodiff_fidelity import cli, paths, readers, report
from cocodiff_fidelity.phantom import STRATEGY, preset_for, run_phantom_step

STEPS = 2


@functools.cache
def no_overlap_slowdown(preset):
    """The --set values that leave compute beside a collective unslowed on `preset`: its overlap
    compute factor and those of its group sizes at 1."""
    with open(paths.cluster(preset), "rb") as f:
        device = tomllib.load(f)["device"]
    return tuple(["cluster.device.overlap_compute_factor=1"]
                 + [f"cluster.device.overlap_by_group.{g}.compute_factor=1"
                    for g, t in device.get("overlap_by_group", {}).items() if "compute_factor" in t])


def predict(a, w, res, strategy, preset, free=False, cache={}):
    """The step and its mean compute in ms, with the overlap slowdown or (FREE) without it."""
    key = (w, res, strategy, preset, free)
    if key not in cache:
        sets = [f"cluster.preset={preset}", *(no_overlap_slowdown(preset) if free else ()), *a.set]
        r = run_phantom_step(a.cocodiff, w, res, STRATEGY[strategy], STEPS, sets)
        cache[key] = {"step_ms": r["virtual_time_s"] / STEPS * 1e3,
                      "compute_ms": r["breakdown"]["mean_compute_s"] / STEPS * 1e3}
    return cache[key]


def unprofiled(directory, transport):
    path = os.path.join(directory, f"steps_{transport}.csv")
    if not os.path.exists(path):
        return {}
    return {(int(r["gpus"]), int(r["resolution"]), r["strategy"]): float(r["median_ms"])
            for r in readers.read_csv(path)}


def overlap_window(gains):
    """Per GPU, transport, size and strategy: the measured compute added over flat (least and
    most over the machines) against the model's with the slowdown to the wait and with none, and
    where the measurement falls (module docstring)."""
    groups = {}
    for r in gains:
        key = (r["machine"][:4], r["transport"], r["gpus"], r["resolution"], r["strategy"])
        groups.setdefault(key, []).append(r)
    out = []
    for (gpu, tr, w, res, st), rs in sorted(groups.items()):
        measured = [r["compute_added_pct"] for r in rs]
        full, none = rs[0]["compute_added_pct_predicted"], rs[0]["compute_added_pct_predicted_no_slowdown"]
        low, high = min(measured), max(measured)
        lo_model, hi_model = min(full, none), max(full, none)
        verdict = "above" if low > hi_model else "below" if high < lo_model else "between"
        # How much of the window's slowdown the measurement takes (0: none, 1: all of it).
        share = (0.5 * (low + high) - none) / (full - none) if full != none else None
        out.append({"gpu": gpu, "transport": tr, "gpus": w, "resolution": res, "strategy": st,
                    "machines": len(rs), "measured_low": low, "measured_high": high,
                    "predicted": full, "predicted_no_slowdown": none, "window": verdict,
                    "share": None if share is None else round(share, 2)})
    return out


def compare(a):
    """Every profiled case beside its predictions."""
    rows = []
    for path in readers.measured_files("h[12]00x*/profile_*.json"):
        machine = readers.machine_of(path)
        transport = os.path.basename(path)[len("profile_"):-len(".json")]
        steps = unprofiled(os.path.dirname(path), transport)
        preset = preset_for(machine, transport)
        for c in readers.read_json(path)["cases"].values():
            w, res, st = c["gpus"], c["resolution"], c["strategy"]
            pred = predict(a, w, res, st, preset)
            free = predict(a, w, res, st, preset, free=True)
            rows.append({"machine": machine, "transport": transport, "gpus": w, "resolution": res,
                         "strategy": st, "preset": preset,
                         "step_ms": round(steps.get((w, res, st), c["step_ms"]), 2),
                         "step_ms_predicted": round(pred["step_ms"], 2),
                         "compute_ms_min": round(c["compute_ms_min"], 2),
                         "compute_ms_max": round(c["compute_ms_max"], 2),
                         "compute_ms_predicted": round(pred["compute_ms"], 2),
                         "compute_ms_predicted_no_slowdown": round(free["compute_ms"], 2),
                         "nccl_ms_fastest_rank": round(c["nccl_ms_min"], 2)})
    return rows


def add_gains(rows):
    """Each strategy's gain over flat and what it adds to compute and NCCL, measured and predicted."""
    flat = {(r["machine"], r["transport"], r["gpus"], r["resolution"]): r
            for r in rows if r["strategy"] == "flat"}
    mean = lambda r: 0.5 * (r["compute_ms_min"] + r["compute_ms_max"])  # noqa: E731
    for r in rows:
        f = flat.get((r["machine"], r["transport"], r["gpus"], r["resolution"]))
        if f is None or r is f:
            continue
        r["gain_ms"] = round(f["step_ms"] - r["step_ms"], 2)
        r["gain_ms_predicted"] = round(f["step_ms_predicted"] - r["step_ms_predicted"], 2)
        r["compute_added_pct"] = round(100 * (mean(r) / mean(f) - 1), 1)
        r["compute_added_pct_predicted"] = round(
            100 * (r["compute_ms_predicted"] / f["compute_ms_predicted"] - 1), 1)
        r["compute_added_pct_predicted_no_slowdown"] = round(
            100 * (r["compute_ms_predicted_no_slowdown"] / f["compute_ms_predicted_no_slowdown"] - 1), 1)
        r["nccl_added_pct"] = round(100 * (r["nccl_ms_fastest_rank"] / f["nccl_ms_fastest_rank"] - 1), 1)


def table(rows, sets):
    lines = ["# Profiled FLUX.1-dev steps (configs/measurements/h[12]00x*/profile_*.json) against cocodiff"
             + (f" ({', '.join(sets)})" if sets else ""),
             f"{'machine':<18}{'tr':<7}{'gpus':>4}{'res':>6} {'strategy':<9}{'step m/p':>16}{'error':>8}"
             f"{'gain m/p':>16}{'compute (range)':>20}{'added m/p':>15}{'nccl':>8}{'added':>8}"]
    for r in rows:
        err = 100 * (r["step_ms_predicted"] / r["step_ms"] - 1)
        gain = f"{r['gain_ms']:.1f}/{r['gain_ms_predicted']:.1f}" if "gain_ms" in r else ""
        added = (f"{r['compute_added_pct']:+.1f}/{r['compute_added_pct_predicted']:+.1f}%"
                 if "compute_added_pct" in r else "")
        nccl_added = f"{r['nccl_added_pct']:+.1f}%" if "nccl_added_pct" in r else ""
        lines.append(f"{r['machine']:<18}{r['transport']:<7}{r['gpus']:>4}{r['resolution']:>6} {r['strategy']:<9}"
                     f"{r['step_ms']:>8.1f}/{r['step_ms_predicted']:<7.1f}{err:>7.1f}%{gain:>16}"
                     f"{r['compute_ms_min']:>9.1f}-{r['compute_ms_max']:<6.1f}/{r['compute_ms_predicted']:<5.0f}"
                     f"{added:>13}{r['nccl_ms_fastest_rank']:>8.1f}{nccl_added:>8}")
    return lines


def window_table(window):
    lines = ["", "## The overlap slowdown's window: compute added over flat's, measured (least-most over the machines) / "
             "the model slowing compute to the wait / the model not slowing it",
             f"{'gpu':<5}{'tr':<7}{'gpus':>4}{'res':>6} {'strategy':<9}{'machines':>9}{'measured':>16}"
             f"{'to wait':>9}{'none':>7}{'share':>7}  window"]
    for k in window:
        lines.append(f"{k['gpu']:<5}{k['transport']:<7}{k['gpus']:>4}{k['resolution']:>6} {k['strategy']:<9}"
                     f"{k['machines']:>9}{k['measured_low']:>+9.1f} to {k['measured_high']:+.1f}%"
                     f"{k['predicted']:>+8.1f}%{k['predicted_no_slowdown']:>+6.1f}%"
                     f"{'' if k['share'] is None else format(k['share'], '.2f'):>7}  {k['window']}")
    return lines


def main(argv=None):
    p = cli.analysis_parser(__doc__)
    p.add_argument("--set", action="append", default=[])
    a = p.parse_args(argv)
    rows = compare(a)
    add_gains(rows)
    gains = [r for r in rows if "gain_ms" in r]
    window = overlap_window(gains)
    lines = table(rows, a.set) + window_table(window)
    summary = {
        "cases": len(rows),
        "gain_median_abs_diff_ms": sorted(abs(r["gain_ms"] - r["gain_ms_predicted"]) for r in gains)[len(gains) // 2]
        if gains else None,
        "compute_added_within_1_5_points": sum(
            abs(r["compute_added_pct"] - r["compute_added_pct_predicted"]) <= 1.5 for r in gains),
        "strategies": len(gains),
        "window_between_above_below": [sum(k["window"] == v for k in window)
                                       for v in ("between", "above", "below")],
    }
    lines += ["", json.dumps(summary, indent=1)]
    report.write_table(a.out, "profile_fidelity", lines,
                       {"rows": rows, "window": window, "summary": summary, "set": a.set})


if __name__ == "__main__":
    main()
