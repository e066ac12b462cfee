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

Usage: profile_fidelity.py COCODIFF [--out DIR] [--set KEY=VALUE ...]
Writes DIR/profile_fidelity.{txt,json} (default bench/fidelity/results).
"""
import argparse, csv, glob, json, os

from phantom_step import STRATEGY, preset_for, run_phantom_step

ROOT = os.environ.get("COCODIFF_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
P = argparse.ArgumentParser()
P.add_argument("cocodiff")
P.add_argument("--out", default=os.path.join(ROOT, "bench", "fidelity", "results"))
P.add_argument("--set", action="append", default=[])
A = P.parse_args()
STEPS = 2


def predict(w, res, strategy, preset, cache={}):
    key = (w, res, strategy, preset)
    if key not in cache:
        r = run_phantom_step(A.cocodiff, ROOT, w, res, STRATEGY[strategy], STEPS,
                             [f"cluster.preset={preset}"] + A.set)
        cache[key] = {"step_ms": r["virtual_time_s"] / STEPS * 1e3,
                      "compute_ms": r["breakdown"]["mean_compute_s"] / STEPS * 1e3}
    return cache[key]


def unprofiled(directory, transport):
    path = os.path.join(directory, f"steps_{transport}.csv")
    if not os.path.exists(path):
        return {}
    return {(int(r["gpus"]), int(r["resolution"]), r["strategy"]): float(r["median_ms"])
            for r in csv.DictReader(open(path))}


def main():
    rows = []
    for path in sorted(glob.glob(os.path.join(ROOT, "configs/measurements/h[12]00x*/profile_*.json"))):
        machine = os.path.basename(os.path.dirname(path))
        transport = os.path.basename(path)[len("profile_"):-len(".json")]
        steps = unprofiled(os.path.dirname(path), transport)
        preset = preset_for(machine, transport)
        for c in json.load(open(path))["cases"].values():
            w, res, st = c["gpus"], c["resolution"], c["strategy"]
            pred = predict(w, res, st, preset)
            rows.append({"machine": machine, "transport": transport, "gpus": w, "resolution": res,
                         "strategy": st, "preset": preset,
                         "step_ms": round(steps.get((w, res, st), c["step_ms"]), 2),
                         "step_ms_predicted": round(pred["step_ms"], 2),
                         "compute_ms_min": round(c["compute_ms_min"], 2),
                         "compute_ms_max": round(c["compute_ms_max"], 2),
                         "compute_ms_predicted": round(pred["compute_ms"], 2),
                         "nccl_ms_fastest_rank": round(c["nccl_ms_min"], 2)})
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
        r["nccl_added_pct"] = round(100 * (r["nccl_ms_fastest_rank"] / f["nccl_ms_fastest_rank"] - 1), 1)
    lines = ["# Profiled FLUX.1-dev steps (configs/measurements/h[12]00x*/profile_*.json) against cocodiff"
             + (f" ({', '.join(A.set)})" if A.set else ""),
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
    gains = [r for r in rows if "gain_ms" in r]
    summary = {
        "cases": len(rows),
        "gain_median_abs_diff_ms": sorted(abs(r["gain_ms"] - r["gain_ms_predicted"]) for r in gains)[len(gains) // 2]
        if gains else None,
        "compute_added_within_1_5_points": sum(
            abs(r["compute_added_pct"] - r["compute_added_pct_predicted"]) <= 1.5 for r in gains),
        "strategies": len(gains),
    }
    lines += ["", json.dumps(summary, indent=1)]
    txt = "\n".join(lines)
    print(txt)
    os.makedirs(A.out, exist_ok=True)
    open(os.path.join(A.out, "profile_fidelity.txt"), "w").write(txt + "\n")
    json.dump({"rows": rows, "summary": summary, "set": A.set},
              open(os.path.join(A.out, "profile_fidelity.json"), "w"), indent=1)


main()
