#!/usr/bin/env python3
"""Fits the host's step factor and sync slowdown (`device.host.step_factor`, `sync_slowdown`) to
host-bound steps with `cocodiff calibrate`, and holds the fit against every machine.

The two figures of the host model a step decides: how much slower a host issues an op inside a
step of two or more ranks than alone, and how much a rank's host time grows with the ranks
whose hosts every exchange waits for (configs/clusters/README.md, "The host"). `cocodiff
calibrate` fits them (calibrate/host_sync_fit.hpp), after the kernels' step factor
(calibrate/device_step_fit.hpp), from the NVLink steps files of the machines named here,
every other figure of the preset as it is; this script runs it on those files alone, prints
what it prints, then times the fitted file's flat 1024^2 step on 2, 3 and 4 GPUs against every
machine's median (held-out machines and 3 GPUs included). The commands in the headers of
configs/clusters/hgx-h100.toml and hgx-h200.toml fit the same figures while they fit the rest of
the cluster.

Usage: fit_host_sync.py COCODIFF [--preset hgx-h100] [--machines h100x4,h100x4-repeat,...]
       fit_host_sync.py COCODIFF --preset hgx-h200 --machines h200x2,h200x4
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from cocodiff_fidelity import paths
from cocodiff_fidelity.phantom import run_phantom_step
from cocodiff_fidelity.readers import read_steps


def measured(machines):
    """{(machine, gpus): median ms} of the flat NVLink 1024^2 steps of every machine of the
    fitted machines' GPU (h100x* or h200x*, by the first machine named)."""
    gpu = machines.split(",")[0][:5]
    return {(machine, w): statistics.median(ms)
            for (machine, tr, w, res, st), ms in read_steps(machines=gpu + "*").items()
            if tr == "nvlink" and res == 1024 and st == "flat" and w > 1}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cocodiff")
    p.add_argument("--preset", default="hgx-h100")
    p.add_argument("--machines", default="h100x4,h100x4-repeat,h100x4-spread,h100x2-spread")
    a = p.parse_args(argv)
    files = [os.path.join("configs/measurements", m, "steps_nvlink.csv") for m in a.machines.split(",")]
    missing = [f for f in files if not os.path.exists(os.path.join(paths.ROOT, f))]
    if missing:
        raise SystemExit("no steps file: " + ", ".join(missing))
    with tempfile.TemporaryDirectory() as d:
        fit = os.path.join(d, "fit.toml")
        cmd = [os.path.abspath(a.cocodiff), "calibrate", *files, "--cluster", a.preset, "--out", fit]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=paths.ROOT)
        if proc.returncode != 0:
            sys.exit(f"cocodiff calibrate failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
        print("\n".join(l for l in proc.stdout.splitlines() if not l.startswith("# Written")))
        m = measured(a.machines)
        print("\nevery machine of that GPU (fitted and held out), median of the machines' flat 1024^2 steps "
              "against the fitted file's:")
        print(f"{'gpus':>5}{'machines':>9}{'min':>8}{'median':>8}{'max':>8}{'predicted':>11}{'vs median':>10}")
        for w in sorted({w for _, w in m}):
            v = sorted(ms for (_, ww), ms in m.items() if ww == w)
            pred = run_phantom_step(a.cocodiff, w, 1024, "flat", 2,
                                    [f"cluster.preset={fit}"])["virtual_time_s"] / 2 * 1e3
            med = statistics.median(v)
            print(f"{w:>5}{len(v):>9}{v[0]:>8.1f}{med:>8.1f}{v[-1]:>8.1f}{pred:>11.1f}{100 * (pred / med - 1):>9.1f}%")


if __name__ == "__main__":
    main()
