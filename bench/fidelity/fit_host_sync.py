#!/usr/bin/env python3
"""Fits the host's sync slowdown (`device.host.sync_slowdown`) to host-bound steps.

The one figure of the host model a step decides: how much a rank's host time grows with the
ranks whose hosts every exchange waits for (configs/clusters/README.md, "The host"). Fitted by
golden-section search on the log error of the flat NVLink steps at 1024^2 (host-bound) on two or
more GPUs of the machines the preset was fitted to (steps_fidelity.py's FITTED), every other
figure of the preset as it is; `per_rank_slowdown` is set to 0 (the two forms are not fitted
together). Prints the fitted value and the steps it was fitted to, then the same step on 2, 3
and 4 GPUs against every machine's median (held-out machines and 3 GPUs included).
`cocodiff calibrate` fits the same figure from the steps files while it fits the rest of a
cluster (the command in configs/clusters/hgx-h100.toml); this script fits it against a shipped
file as it is and compares every machine.

Usage: fit_host_sync.py COCODIFF [--preset hgx-h100] [--machines h100x4,h100x4-repeat,...]
       fit_host_sync.py COCODIFF --preset hgx-h200 --machines h200x2
"""
import argparse, math, os, statistics

from phantom_step import read_steps, run_phantom_step

ROOT = os.environ.get("COCODIFF_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
P = argparse.ArgumentParser()
P.add_argument("cocodiff")
P.add_argument("--preset", default="hgx-h100")
P.add_argument("--machines", default="h100x4,h100x4-repeat,h100x4-spread,h100x2-spread")
A = P.parse_args()


def measured():
    """{(machine, gpus): median ms} of the flat NVLink 1024^2 steps of every machine of the
    fitted machines' GPU (h100x* or h200x*, by the first machine named)."""
    gpu = A.machines.split(",")[0][:5]
    return {(machine, w): statistics.median(ms)
            for (machine, tr, w, res, st), ms in read_steps(ROOT, gpu + "*").items()
            if tr == "nvlink" and res == 1024 and st == "flat" and w > 1}


def predict(w, sync, cache={}):
    if (w, sync) not in cache:
        sets = [f"cluster.preset={A.preset}", "cluster.device.host.per_rank_slowdown=0",
                f"cluster.device.host.sync_slowdown={sync:.6g}"]
        r = run_phantom_step(A.cocodiff, ROOT, w, 1024, "flat", 2, sets)
        cache[(w, sync)] = r["virtual_time_s"] / 2 * 1e3
    return cache[(w, sync)]


def main():
    m = measured()
    fit = {k: v for k, v in m.items() if k[0] in A.machines.split(",")}
    if not fit:
        raise SystemExit("no flat NVLink 1024^2 step on 2+ GPUs of " + A.machines)

    def loss(sync):
        return sum((math.log(predict(w, sync)) - math.log(ms)) ** 2 for (_, w), ms in fit.items())

    lo, hi = 0.0, 6.0
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(a), loss(b)
    while hi - lo > 0.01:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(b)
    sync = round((lo + hi) / 2, 2)
    print(f"sync_slowdown = {sync} (rms log error {math.sqrt(loss(sync) / len(fit)):.3f} over {len(fit)} steps)")
    print(f"{'machine':<22}{'gpus':>5}{'measured':>10}{'predicted':>11}{'error':>8}")
    for (machine, w), ms in sorted(fit.items()):
        p = predict(w, sync)
        print(f"{machine:<22}{w:>5}{ms:>10.1f}{p:>11.1f}{100 * (p / ms - 1):>7.1f}%")
    print("\nevery machine of that GPU (fitted and held out), median of the machines' steps:")
    print(f"{'gpus':>5}{'machines':>9}{'min':>8}{'median':>8}{'max':>8}{'predicted':>11}{'vs median':>10}")
    for w in sorted({w for _, w in m}):
        v = sorted(ms for (_, ww), ms in m.items() if ww == w)
        p = predict(w, sync)
        med = statistics.median(v)
        print(f"{w:>5}{len(v):>9}{v[0]:>8.1f}{med:>8.1f}{v[-1]:>8.1f}{p:>11.1f}{100 * (p / med - 1):>9.1f}%")


if __name__ == "__main__":
    main()
