#!/usr/bin/env python3
"""Whole FLUX.1-dev steps measured on 1, 2 and 4 H100s against cocodiff's predictions.

For every row of configs/measurements/h100x*/steps_<transport>.csv, runs the same step in the
emulator (phantom mode, FLUX.1-dev, the cluster preset on one node of W GPUs) and prints
measured / predicted / error, each strategy's speedup over flat measured and predicted, and the
ranking. Strategies run as the measured PyTorch step runs them: plain all-to-alls (flat), with
V-First, with pipelining (2 head groups) and with both (cocodiff without V-Major).
Shared memory: the h100-shm preset, which `cocodiff calibrate` fitted to the shared-memory
sweeps (configs/clusters/h100-shm.toml says how); --shm-preset "" sets the NVLink link's bandwidth
to the all-to-all bus bandwidth measured over shared memory at 1 GiB on 4 GPUs instead.
The preset was fitted to the 4-GPU machines (h100x4, h100x4-repeat) and its rank_spread to the
breakdowns of h100x4-spread and h100x2-spread; the machines measured
later on other hosts (h100x2, h100x2-spread-check, h100x2-profile, h100x2-breakdown,
h100x2-repeat: 2 GPUs;
h100x4-third, h100x4-breakdown,
h100x4-spread-check, h100x4-spread-check2, h100x4-profile, h100x4-profile2, h100x4-fourth,
h100x4-breakdown2, h100x4-fifth and h100x4-hostbeside: 4 GPUs; h100x4-threesteps and
h100x4-threesteps2: 3 GPUs) are held out: their steps are summarised apart. At 1024^2 every prediction is held against the range the machines of its GPU measured. The H200
machines are predicted by hgx-h200 (--h200-preset) and, over shared memory, by h200-shm
(--h200-shm-preset), both fitted to h200x2 and (the shared-memory spread) h200x2-breakdown;
h200x2-second, h200x2-profile and h200x2-hostbeside, measured on another lease after both
presets were fitted, are held out. H200 steps are summarised apart.

Usage: steps_fidelity.py COCODIFF [--preset hgx-h100] [--shm-preset h100-shm] [--out DIR]
                          [--set KEY=VALUE ...]
Writes DIR/steps_fidelity.{csv,json,txt} (default bench/fidelity/results).
"""
import json
import math
import os
import statistics

from cocodiff_fidelity import cli, paths, readers, report
from cocodiff_fidelity.phantom import STRATEGY, preset_for, run_phantom_step
from cocodiff_fidelity.readers import read_steps

STEPS = 2
FITTED = {"h100x4", "h100x4-repeat", "h100x4-spread", "h100x2-spread"}  # the machines hgx-h100 was fitted to (host costs; rank_spread)
# the H200 machines hgx-h200 and h200-shm were fitted to (kernel tables, host costs, interference,
# the shared-memory sweeps; the shared-memory interference and breakdown of a second host)
FITTED_H200 = {"h200x2", "h200x2-breakdown", "h200x4", "h200x4-breakdown"}


def shm_bandwidth():
    rows = readers.read_csv(paths.measurement("h100x4", "collectives_shm.csv"))
    big = [r for r in rows if r["op"] == "all_to_all" and r["ranks"] == "4" and int(r["bytes"]) == 1 << 30]
    r = big[0]
    busbw = int(r["bytes"]) / (float(r["time_us"]) * 1e-6) * 3 / 4 / 1e9
    return busbw


def parser():
    p = cli.analysis_parser(__doc__)
    p.add_argument("--preset", default="hgx-h100")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--shm-preset", default="h100-shm")  # "": the NVLink link at the shm bandwidth
    p.add_argument("--h200-preset", default="hgx-h200")  # for the H200 machines (h200x*)
    p.add_argument("--h200-shm-preset", default="h200-shm")  # "": hgx-h200's link at the shm bandwidth
    return p


def predict(a, w, res, strategy, transport, machine, scale=None, cache={}):
    """One step's ms under the preset the options choose for the machine and transport; SCALE:
    device.host.scale (None: the preset's)."""
    h200 = machine.startswith("h200")
    key = (w, res, strategy, transport, h200, scale)
    if key in cache:
        return cache[key]
    # phantom.preset_for chooses the preset (as profile_fidelity.py does); the options
    # replace its choice, and an empty shared-memory one takes the NVLink preset with the link at
    # the shared-memory bandwidth.
    chosen = {"hgx-h100": a.preset, "h100-shm": a.shm_preset, "hgx-h200": a.h200_preset,
              "h200-shm": a.h200_shm_preset}[preset_for(machine, transport)]
    nvlink = a.h200_preset if h200 else a.preset
    sets = [f"cluster.preset={chosen or nvlink}"] + a.set
    if not chosen:
        sets.append(f"cluster.links.nvlink.bandwidth_gbytes_per_s={shm_bandwidth():.4g}")
    if scale is not None:
        sets.append(f"cluster.device.host.scale={scale}")
    r = run_phantom_step(a.cocodiff, w, res, STRATEGY[strategy], STEPS, sets)
    cache[key] = r["virtual_time_s"] / STEPS * 1e3
    return cache[key]


def compare(a):
    """Every measured step beside its prediction, with the speedups over flat."""
    measured = read_steps()  # (machine, transport, w, res, strategy) -> ms, each run of it
    rows = []
    for (machine, tr, w, res, st), runs in sorted(measured.items()):
        ms = statistics.median(runs)  # a step measured twice in one launch: the median of both
        if w == 1 and tr == "shm":
            continue
        pred = predict(a, w, res, st, tr, machine)
        rows.append({"machine": machine, "transport": tr, "gpus": w, "resolution": res, "strategy": st,
                     "measured_ms": round(ms, 3), "predicted_ms": round(pred, 3),
                     "error_pct": round(100 * (pred / ms - 1), 1)})
    # speedups over flat (same machine, transport, GPUs, resolution)
    base = {(r["machine"], r["transport"], r["gpus"], r["resolution"]): r for r in rows if r["strategy"] == "flat"}
    for r in rows:
        b = base.get((r["machine"], r["transport"], r["gpus"], r["resolution"]))
        if b and r["gpus"] > 1:
            r["speedup_measured"] = round(b["measured_ms"] / r["measured_ms"], 3)
            r["speedup_predicted"] = round(b["predicted_ms"] / r["predicted_ms"], 3)
            r["speedup_diff_points"] = round(100 * (r["speedup_predicted"] - r["speedup_measured"]), 1)
    return rows


def table(a, rows):
    lines = [f"# FLUX.1-dev steps on H100 (configs/measurements/h100x*/steps_*.csv) against cocodiff "
             f"(preset {a.preset}{', ' + ', '.join(a.set) if a.set else ''})",
             f"{'machine':<22}{'transport':<10}{'gpus':>4}{'res':>6} {'strategy':<9}{'measured':>10}"
             f"{'predicted':>11}{'error':>8}{'speedup m/p':>16}"]
    for r in rows:
        sp = f"{r['speedup_measured']:.3f}/{r['speedup_predicted']:.3f}" if "speedup_measured" in r else ""
        lines.append(f"{r['machine']:<22}{r['transport']:<10}{r['gpus']:>4}{r['resolution']:>6} {r['strategy']:<9}"
                     f"{r['measured_ms']:>10.1f}{r['predicted_ms']:>11.1f}{r['error_pct']:>7.1f}%{sp:>16}")
    return lines


def stats(subset):
    """Per resolution: the errors and the speedups' agreement of SUBSET's rows."""
    out = {}
    for res in sorted({r["resolution"] for r in subset}):
        errs = [abs(r["error_pct"]) for r in subset if r["resolution"] == res]
        if not errs:
            continue
        sd = [abs(r["speedup_diff_points"]) for r in subset if r["resolution"] == res
              and "speedup_diff_points" in r and r["strategy"] != "flat"]
        sign = [r for r in subset if r["resolution"] == res and "speedup_diff_points" in r
                and r["strategy"] != "flat"
                and (r["speedup_measured"] - 1) * (r["speedup_predicted"] - 1) < 0
                and abs(r["speedup_measured"] - 1) > 0.01]
        out[res] = {"steps": len(errs), "median_abs_error_pct": statistics.median(errs),
                    "max_abs_error_pct": max(errs), "within_10pct": sum(e <= 10 for e in errs),
                    "speedup_median_abs_diff_points": statistics.median(sd) if sd else None,
                    "speedup_within_5_points": sum(d <= 5 for d in sd), "speedups": len(sd),
                    "speedup_sign_disagreements": len(sign)}
    return out


def summarize(rows):
    """The fitted and held-out machines' errors, per GPU."""
    fitted = [r for r in rows if r["machine"] in FITTED]
    summary = stats(fitted)
    held = [r for r in rows if r["machine"].startswith("h100x") and r["machine"] not in FITTED]
    if held:
        summary["held_out_" + "_".join(sorted({r["machine"] for r in held}))] = stats(held)
    for name, h200 in (("h200_fitted_", [r for r in rows if r["machine"] in FITTED_H200]),
                       ("h200_held_out_", [r for r in rows if r["machine"].startswith("h200")
                                           and r["machine"] not in FITTED_H200])):
        if h200:
            summary[name + "_".join(sorted({r["machine"] for r in h200}))] = stats(h200)
    return summary


def machine_ranges(rows, lines, summary):
    """1024^2: is each prediction inside the range measured across the machines of its GPU that
    ran the step, widened by 15%?"""
    for gpu in ("h100", "h200"):
        inside = total = 0
        same = [r for r in rows if r["machine"].startswith(gpu + "x")]
        lines.append("")
        lines.append(f"# 1024^2 (host-bound): each configuration's prediction against the range of the "
                     f"{gpu.upper()} machines that measured it, widened by 15% (low / 1.15 to high x 1.15)")
        lines.append(f"{'transport':9s} {'gpus':>4s} {'strategy':9s} {'machines':>8s} {'low':>7s} {'median':>7s} "
                     f"{'high':>7s} {'predicted':>9s}  inside")
        for key in sorted({(r["transport"], r["gpus"], r["strategy"]) for r in same if r["resolution"] == 1024}):
            ms = [r for r in same if r["resolution"] == 1024 and (r["transport"], r["gpus"], r["strategy"]) == key]
            vals = [r["measured_ms"] for r in ms]
            lo, hi = min(vals) / 1.15, max(vals) * 1.15
            total += 1
            ok = lo <= ms[0]["predicted_ms"] <= hi
            inside += ok
            lines.append(f"{key[0]:9s} {key[1]:4d} {key[2]:9s} {len(vals):8d} {min(vals):7.1f} "
                         f"{statistics.median(vals):7.1f} {max(vals):7.1f} {ms[0]['predicted_ms']:9.1f}  "
                         f"{'yes' if ok else 'NO'}")
        summary[("" if gpu == "h100" else gpu + "_") + "1024_inside_machine_range_widened_15pct"] = \
            f"{inside}/{total}"


def host_ranges(a, rows, lines, summary):
    """The hosts of the machines: device.host.range as `cocodiff calibrate` defines it (the lowest
    and highest measured / predicted of the flat host-bound steps of 2 or more GPUs, here over
    every machine of the GPU, rounded outwards to 0.01), then every 1024^2 configuration
    predicted with device.host.scale at both ends against the range the machines measured."""
    for gpu in ("h100", "h200"):
        flat = [r for r in rows if r["machine"].startswith(gpu + "x") and r["resolution"] == 1024
                and r["strategy"] == "flat" and r["transport"] == "nvlink" and r["gpus"] >= 2]
        ratios = [r["measured_ms"] / r["predicted_ms"] for r in flat]
        low = math.floor(min(ratios) * 100 * (1 + 1e-12)) / 100
        high = math.ceil(max(ratios) * 100 * (1 - 1e-12)) / 100
        lines.append("")
        lines.append(f"# {gpu.upper()} hosts: device.host.range = [{low:.2f}, {high:.2f}], the lowest and highest "
                     f"measured / predicted of {len(flat)} flat NVLink 1024^2 steps of 2 or more GPUs on "
                     f"{len({r['machine'] for r in flat})} machines; each 1024^2 configuration predicted with "
                     f"device.host.scale at both ends against the machines' range")
        lines.append(f"{'transport':9s} {'gpus':>4s} {'strategy':9s} {'machines':>8s} {'low':>7s} {'high':>7s} "
                     f"{'pred_low':>9s} {'pred_high':>9s}  measured inside  overlap")
        same = [r for r in rows if r["machine"].startswith(gpu + "x") and r["resolution"] == 1024 and r["gpus"] >= 2]
        inside = overlap = total = 0
        for key in sorted({(r["transport"], r["gpus"], r["strategy"]) for r in same}):
            vals = [r["measured_ms"] for r in same if (r["transport"], r["gpus"], r["strategy"]) == key]
            machine = next(r["machine"] for r in same if (r["transport"], r["gpus"], r["strategy"]) == key)
            p_lo = predict(a, key[1], 1024, key[2], key[0], machine, f"{low:.2f}")
            p_hi = predict(a, key[1], 1024, key[2], key[0], machine, f"{high:.2f}")
            ins = p_lo <= min(vals) and max(vals) <= p_hi
            ovl = p_lo <= max(vals) and min(vals) <= p_hi
            total += 1
            inside += ins
            overlap += ovl
            lines.append(f"{key[0]:9s} {key[1]:4d} {key[2]:9s} {len(vals):8d} {min(vals):7.1f} {max(vals):7.1f} "
                         f"{p_lo:9.1f} {p_hi:9.1f}  {'yes' if ins else 'NO':>15s}  {'yes' if ovl else 'NO':>7s}")
        summary[gpu + "_host_range"] = {"range": [low, high], "flat_steps": len(flat),
                                         "configurations": total,
                                         "measured_range_inside_predicted": inside,
                                         "measured_range_overlaps_predicted": overlap}


def main(argv=None):
    a = parser().parse_args(argv)
    rows = compare(a)
    lines = table(a, rows)
    summary = summarize(rows)
    machine_ranges(rows, lines, summary)
    host_ranges(a, rows, lines, summary)
    lines.append("")
    lines.append(json.dumps(summary, indent=1))
    report.write_table(a.out, "steps_fidelity", lines,
                       {"rows": rows, "summary": summary, "preset": a.preset, "set": a.set})
    report.write_csv_dicts(os.path.join(a.out, "steps_fidelity.csv"),
                           list(rows[0].keys()) + ["speedup_measured", "speedup_predicted", "speedup_diff_points"],
                           rows)


if __name__ == "__main__":
    main()

