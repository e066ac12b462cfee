#!/usr/bin/env python3
"""Fits [device.host.inductor] of a preset to torch.compile forwards measured on one GPU.

torch.compile's default mode (inductor, no CUDA graphs) fuses the memory-bound kernels of a
forward (norms, RoPE, modulation, residuals, activations) into fewer, larger ones and launches
every kernel from a generated Python wrapper. cocodiff models it with two figures:

  fusion     a memory-bound kernel takes this fraction of its eager time (GEMMs and attention,
             which inductor calls out to cuBLAS and SDPA, keep theirs)
  launch_us  the wrapper's host time to launch one op

Each is determined by its own rows: `fusion` by the forwards where the GPU is the bottleneck
(host_ms under 90% of the device time), `launch_us` by the host-bound ones. Both are found by a
golden-section search on the median absolute log error of cocodiff's phantom forward
(cocodiff_fidelity.phantom.predict_forward) against the measured median, one after the other, then `fusion` again
with the fitted launch cost. The rows of HOLD_OUT families (default: Wan 2.1) are not fitted and
are reported as held out.

Usage: fit_inductor.py COCODIFF [--preset hgx-h200] [--measured h200x1-compiled]
                       [--hold-out wan] [--out DIR] [--name inductor_fit]
Writes DIR/NAME.{txt,json} (default bench/fidelity/results/).
"""
import math
import statistics
import sys

from cocodiff_fidelity import cli, paths, readers, report
from cocodiff_fidelity.phantom import predict_forward as predict

GOLDEN = (math.sqrt(5) - 1) / 2


def golden(f, lo, hi, iters=24):
    """The minimum of a unimodal f on [lo, hi]."""
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
    return (a + b) / 2


def main(argv=None):
    p = cli.analysis_parser(__doc__)
    p.add_argument("--preset", default="hgx-h200")
    p.add_argument("--measured", default="h200x1-compiled")
    p.add_argument("--hold-out", default="wan", help="comma-separated families not fitted")
    p.add_argument("--name", default="inductor_fit")
    a = p.parse_args(argv)
    held = {f for f in a.hold_out.split(",") if f}
    rows = readers.read_csv(paths.measurement(a.measured, "forwards.csv"))
    for r in rows:
        r["host_bound"] = float(r["host_ms"]) >= 0.9 * float(r["median_ms"])
    fit = [r for r in rows if r["family"] not in held]
    gpu_rows = [r for r in fit if not r["host_bound"]]
    host_rows = [r for r in fit if r["host_bound"]]
    if not gpu_rows or not host_rows:
        sys.exit("fit_inductor: need GPU-bound and host-bound rows outside the held-out families")
    cache = {}

    def sets(fusion, launch):
        return (f"cluster.device.host.inductor.fusion={fusion:.4f}",
                f"cluster.device.host.inductor.launch_us={launch:.3f}")

    def err(sel, fusion, launch):
        e = [abs(math.log(predict(a.cocodiff, a.preset, r, cache, "inductor", sets(fusion, launch))
                          / float(r["median_ms"]))) for r in sel]
        return statistics.median(e)

    fusion = golden(lambda f: err(gpu_rows, f, 0.0), 0.05, 1.0)
    launch = golden(lambda l: err(host_rows, fusion, l), 0.0, 100.0)
    fusion = golden(lambda f: err(gpu_rows, f, launch), 0.05, 1.0)
    fusion, launch = round(fusion, 3), round(launch, 2)
    out_rows = []
    for r in rows:
        pred = predict(a.cocodiff, a.preset, r, cache, "inductor", sets(fusion, launch))
        graph = predict(a.cocodiff, a.preset, r, cache, "compiled")
        m = float(r["median_ms"])
        out_rows.append({"model": r["model"], "width": int(r["width"]), "height": int(r["height"]),
                         "batch": int(r["batch"]), "frames": int(r.get("frames") or 1),
                         "measured_ms": m, "host_ms": float(r["host_ms"]),
                         "bound": "host" if r["host_bound"] else "gpu",
                         "role": "held out" if r["family"] in held else
                                 ("fits launch_us" if r["host_bound"] else "fits fusion"),
                         "predicted_ms": pred, "error": pred / m - 1,
                         "compiled_ms": graph, "compiled_error": graph / m - 1})
    lines = [f"# [device.host.inductor] of {a.preset} fitted to configs/measurements/{a.measured}/ "
             "(torch.compile, default mode, one H200)",
             f"# fusion = {fusion}  (a memory-bound kernel's share of its eager time)",
             f"# launch_us = {launch}  (the compiled wrapper's host time an op)",
             f"{'model':<16} {'size':>9} {'frames':>6} {'measured_ms':>11} {'host_ms':>8} "
             f"{'inductor_ms':>11} {'error':>7} {'compiled_ms':>11} {'error':>7}  bound role"]
    for o in out_rows:
        lines.append(f"{o['model']:<16} {o['width']:>4}x{o['height']:<4} {o['frames']:>6} "
                     f"{o['measured_ms']:>11.2f} {o['host_ms']:>8.2f} {o['predicted_ms']:>11.2f} "
                     f"{100 * o['error']:>+6.1f}% {o['compiled_ms']:>11.2f} "
                     f"{100 * o['compiled_error']:>+6.1f}%  {o['bound']:<5} {o['role']}")
    for role in ("fits fusion", "fits launch_us", "held out"):
        sel = [abs(o["error"]) for o in out_rows if o["role"] == role]
        if sel:
            lines.append(f"# {role:<15} {len(sel):2d} rows: |error| median {100 * statistics.median(sel):.1f}%, "
                         f"max {100 * max(sel):.1f}%")
    sel = [abs(o["compiled_error"]) for o in out_rows]
    lines.append(f"# framework = \"compiled\" (no fusion, no launch cost) on the same rows: |error| median "
                 f"{100 * statistics.median(sel):.1f}%, max {100 * max(sel):.1f}%")
    report.write_table(a.out, a.name, lines, {"preset": a.preset, "measured": a.measured, "fusion": fusion,
                                              "launch_us": launch, "held_out": sorted(held), "rows": out_rows},
                       json_newline=True)


if __name__ == "__main__":
    main()
