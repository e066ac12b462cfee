#!/usr/bin/env python3
"""Flat FLUX.1-dev steps split into their exchanges and the rest, measured on H100s, against the
emulator's own breakdown of the same step.

For every case of configs/measurements/h[12]00x*/breakdown_<transport>.json, runs the same flat
step in the emulator (phantom mode, FLUX.1-dev, the cluster preset on one node of W GPUs: NVLink
hgx-h100, shared memory h100-shm, H200 hgx-h200 and h200-shm) and prints, in ms a step:
  step        the slowest rank's step, measured / predicted;
  exchanges   each rank's time in its blocking exchanges (least to most), against each tile's
              exposed communication;
  rest        each rank's time outside them, against each tile's compute (the model's compute
              includes neither host waits nor exchanges);
  wait        how long the mean rank waits for the slowest rank's work before an exchange,
              summed over the step (measured between exchanges: segment_wait_ms), against the
              model's mean exposed communication less the least (the slowest tile waits only for
              the transfers);
and the case's error. A case where the GPU waits for its own host for more than 1% of the step is
marked host-bound: its exchanges hold the hosts' waits, which the model charges to the host.
Files from before segment times (or host waits) were measured have no wait column (or are not
counted in the device-bound summary).

Usage: breakdown_fidelity.py COCODIFF [--out DIR] [--set KEY=VALUE ...]
Writes DIR/breakdown_fidelity.{txt,json} (default bench/fidelity/results).
"""
import os
import statistics

from cocodiff_fidelity import cli, readers, report
from cocodiff_fidelity.phantom import preset_for, run_phantom_step

STEPS = 2


def predict(a, w, res, machine, transport):
    """The emulator's breakdown of the same flat step, in ms a step."""
    r = run_phantom_step(a.cocodiff, w, res, "flat", STEPS,
                         [f"cluster.preset={preset_for(machine, transport)}"] + a.set)
    b = r["breakdown"]
    ms = lambda s: s / STEPS * 1e3  # noqa: E731
    return {"step_ms": ms(r["virtual_time_s"]), "exchanges_ms_min": ms(b["min_exposed_comm_s"]),
            "exchanges_ms_max": ms(b["max_exposed_comm_s"]), "rest_ms_mean": ms(b["mean_compute_s"]),
            "wait_ms": ms(b["mean_exposed_comm_s"] - b["min_exposed_comm_s"]),
            "preset": preset_for(machine, transport)}


def compare(a):
    """Every measured case beside its prediction, with the errors."""
    rows = []
    for path in readers.measured_files("h[12]00x*/breakdown_*.json"):
        machine = readers.machine_of(path)
        transport = os.path.basename(path)[len("breakdown_"):-len(".json")]
        for key, c in sorted(readers.read_json(path)["cases"].items()):
            pred = predict(a, c["gpus"], c["resolution"], machine, transport)
            row = {"machine": machine, "transport": transport, "gpus": c["gpus"],
                   "resolution": c["resolution"],
                   "host_bound": (c["host_late_ms_max"] > 0.01 * c["step_ms"]
                                  if "host_late_ms_max" in c else None),
                   "step_ms": c["step_ms"], "exchanges_ms_min": c["exchanges_ms_min"],
                   "exchanges_ms_max": c["exchanges_ms_max"],
                   "rest_ms_mean": 0.5 * (c["rest_ms_min"] + c["rest_ms_max"]),
                   "wait_ms": c.get("segment_wait_ms"), "predicted": pred}
            mean_ex = 0.5 * (c["exchanges_ms_min"] + c["exchanges_ms_max"])
            pred_ex = 0.5 * (pred["exchanges_ms_min"] + pred["exchanges_ms_max"])
            row["step_error_pct"] = round(100 * (pred["step_ms"] / c["step_ms"] - 1), 1)
            row["exchanges_ratio"] = round(mean_ex / pred_ex, 3) if pred_ex > 0 else None
            row["rest_error_pct"] = round(100 * (pred["rest_ms_mean"] / row["rest_ms_mean"] - 1), 1)
            rows.append(row)
    return rows


def table(rows, sets):
    """The text table's lines."""
    head = (f"{'machine':<22}{'transport':<10}{'gpus':>4}{'res':>6}{'step m/p':>16}{'error':>8}"
            f"{'exchanges m (ranks)':>22}{'p (tiles)':>14}{'m/p':>7}{'rest m/p':>16}{'error':>8}"
            f"{'wait m/p':>14}")
    lines = ["# Flat FLUX.1-dev steps split into exchanges and the rest (configs/measurements/*/breakdown_*.json) "
             "against cocodiff's breakdown (ms a step" + (", " + ", ".join(sets) if sets else "") + ")", head]
    for r in rows:
        p = r["predicted"]
        wait = f"{r['wait_ms']:.1f}/{p['wait_ms']:.1f}" if r["wait_ms"] is not None else f"-/{p['wait_ms']:.1f}"
        lines.append(
            f"{r['machine']:<22}{r['transport']:<10}{r['gpus']:>4}{r['resolution']:>6}"
            f"{r['step_ms']:>8.1f}/{p['step_ms']:<7.1f}{r['step_error_pct']:>7.1f}%"
            f"{r['exchanges_ms_min']:>14.1f}-{r['exchanges_ms_max']:<7.1f}"
            f"{p['exchanges_ms_min']:>7.1f}-{p['exchanges_ms_max']:<6.1f}{r['exchanges_ratio']:>7.2f}"
            f"{r['rest_ms_mean']:>8.1f}/{p['rest_ms_mean']:<7.1f}{r['rest_error_pct']:>7.1f}%{wait:>14}"
            + {True: "  host-bound", False: "", None: "  (host wait not timed)"}[r["host_bound"]])
    return lines


def summarize(rows, lines):
    """The device-bound cases' summary (appended to LINES as a comment)."""
    dev = [r for r in rows if r["host_bound"] is False]
    summary = {}
    if dev:
        summary = {
            "device_bound_cases": len(dev),
            "step_median_abs_error_pct": statistics.median(abs(r["step_error_pct"]) for r in dev),
            "rest_median_abs_error_pct": statistics.median(abs(r["rest_error_pct"]) for r in dev),
            "exchanges_measured_over_predicted_median": statistics.median(r["exchanges_ratio"] for r in dev),
            "wait_measured_ms": [round(r["wait_ms"], 2) for r in dev if r["wait_ms"] is not None],
            "wait_predicted_ms": [round(r["predicted"]["wait_ms"], 2) for r in dev if r["wait_ms"] is not None],
        }
        lines.append(
            f"# device-bound cases: {len(dev)}; step error median {summary['step_median_abs_error_pct']:.1f}%, "
            f"the rest (compute) {summary['rest_median_abs_error_pct']:.1f}%, exchanges measured / predicted "
            f"{summary['exchanges_measured_over_predicted_median']:.2f} (median)")
    return summary


def main(argv=None):
    p = cli.analysis_parser(__doc__)
    p.add_argument("--set", action="append", default=[])
    a = p.parse_args(argv)
    rows = compare(a)
    lines = table(rows, a.set)
    summary = summarize(rows, lines)
    report.write_table(a.out, "breakdown_fidelity", lines, {"rows": rows, "summary": summary, "set": a.set})


if __name__ == "__main__":
    main()
