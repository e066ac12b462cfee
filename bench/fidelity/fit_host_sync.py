#!/usr/bin/env python3
"""Fits the host's step factor and sync slowdown (`device.host.step_factor`, `sync_slowdown`) to
host-bound steps.

The two figures of the host model a step decides: how much slower a host issues an op inside a
whole step than alone (any rank count), and how much a rank's host time grows with the ranks
whose hosts every exchange waits for (configs/clusters/README.md, "The host"). Fitted as
`cocodiff calibrate` fits them (apps/calibrate/host_sync_fit.hpp): each GPU count's whole factor
by golden-section search on the log error of the flat NVLink steps at 1024^2 (host-bound) of the
machines the preset was fitted to, then a line in H(n) - 1 through them; every other figure of
the preset as it is, `per_rank_slowdown` 0. Prints the fitted values and the steps they were
fitted to, then the same step on 2, 3 and 4 GPUs against every machine's median (held-out
machines and 3 GPUs included). `cocodiff calibrate` fits the same figures from the steps files
while it fits the rest of a cluster (the commands in configs/clusters/hgx-h100.toml and
hgx-h200.toml); this script fits them against a shipped file as it is and compares every machine.

Usage: fit_host_sync.py COCODIFF [--preset hgx-h100] [--machines h100x4,h100x4-repeat,...]
       fit_host_sync.py COCODIFF --preset hgx-h200 --machines h200x2,h200x4
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


def predict(w, factor, sync, cache={}):
    if (w, factor, sync) not in cache:
        sets = [f"cluster.preset={A.preset}", "cluster.device.host.per_rank_slowdown=0",
                f"cluster.device.host.step_factor={factor:.6g}",
                f"cluster.device.host.sync_slowdown={sync:.6g}"]
        r = run_phantom_step(A.cocodiff, ROOT, w, 1024, "flat", 2, sets)
        cache[(w, factor, sync)] = r["virtual_time_s"] / 2 * 1e3
    return cache[(w, factor, sync)]


def golden(loss, lo, hi, tol):
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(a), loss(b)
    while hi - lo > tol:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(b)
    return (lo + hi) / 2


def harmonic_excess(n):
    return sum(1.0 / k for k in range(2, n + 1))


def main():
    m = measured()
    fit = {k: v for k, v in m.items() if k[0] in A.machines.split(",")}
    if not fit:
        raise SystemExit("no flat NVLink 1024^2 step on 2+ GPUs of " + A.machines)

    # as apps/calibrate/host_sync_fit.cpp: each GPU count's whole factor, then a line in H(n) - 1
    whole = {}
    for n in sorted({w for _, w in fit}):
        cases = [ms for (_, w), ms in fit.items() if w == n]
        c = golden(lambda c: sum((math.log(predict(n, c, 0.0)) - math.log(ms)) ** 2 for ms in cases),
                   0.1, 10.0, 0.0005)
        whole[n] = (c, len(cases))
    if len(whole) == 1:
        (n, (c, _)), = whole.items()
        b = max(0.0, c - 1)
        a, b = c - b, b / harmonic_excess(n)
    else:
        sw = sum(w for _, w in whole.values())
        sx = sum(w * harmonic_excess(n) for n, (_, w) in whole.items())
        sy = sum(w * c for c, w in whole.values())
        sxx = sum(w * harmonic_excess(n) ** 2 for n, (_, w) in whole.items())
        sxy = sum(w * harmonic_excess(n) * c for n, (c, w) in whole.items())
        b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
        a = (sy - b * sx) / sw
        if b < 0 or a <= 0:
            a, b = sy / sw, 0.0
    factor = min(10.0, max(0.1, round(a, 2)))
    sync = min(10.0, max(0.0, round(b / a, 2)))
    rms = math.sqrt(sum((math.log(predict(w, factor, sync)) - math.log(ms)) ** 2
                        for (_, w), ms in fit.items()) / len(fit))
    print(f"step_factor = {factor}, sync_slowdown = {sync} (rms log error {rms:.3f} over {len(fit)} steps, "
          f"{len(whole)} GPU counts)")
    print(f"{'machine':<22}{'gpus':>5}{'measured':>10}{'predicted':>11}{'error':>8}")
    for (machine, w), ms in sorted(fit.items()):
        p = predict(w, factor, sync)
        print(f"{machine:<22}{w:>5}{ms:>10.1f}{p:>11.1f}{100 * (p / ms - 1):>7.1f}%")
    print("\nevery machine of that GPU (fitted and held out), median of the machines' steps:")
    print(f"{'gpus':>5}{'machines':>9}{'min':>8}{'median':>8}{'max':>8}{'predicted':>11}{'vs median':>10}")
    for w in sorted({w for _, w in m}):
        v = sorted(ms for (_, ww), ms in m.items() if ww == w)
        p = predict(w, factor, sync)
        med = statistics.median(v)
        print(f"{w:>5}{len(v):>9}{v[0]:>8.1f}{med:>8.1f}{v[-1]:>8.1f}{p:>11.1f}{100 * (p / med - 1):>9.1f}%")


if __name__ == "__main__":
    main()
