#!/usr/bin/env python3
"""Interleaved CPU time of two cocodiff builds on the same phantom runs (FLUX.1-dev 2048^2 on
Aurora, uneven heads, one emulator worker): the 96-tile image (8 nodes) per strategy and the
1,536-tile image (128 nodes) of usp and cocodiff, 28 steps; medians of --repeats; each pair must
give the same timeline hash.
Usage: speed_ab.py BEFORE AFTER [--repeats 3] [--only STRATEGY:NODES,...]"""
import json, os, resource, statistics, subprocess, sys, tempfile
before, after = sys.argv[1], sys.argv[2]
repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3
root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
cases = [(s, 8) for s in ("flat", "tapa", "v_first", "pipeline", "cocodiff", "usp")] + \
        [("usp", 128), ("cocodiff", 128)]
if "--only" in sys.argv:
    only = sys.argv[sys.argv.index("--only") + 1].split(",")
    cases = [(x.split(":")[0], int(x.split(":")[1])) for x in only]
def run(binary, strategy, nodes):
    with tempfile.TemporaryDirectory() as d:
        sets = ["run.math=skip", "model.preset=flux1-dev", "run.resolution=2048", "run.steps=28",
                f"run.strategy={strategy}", "cluster.preset=aurora", f"cluster.nodes={nodes}",
                "ulysses.uneven_heads=true", "v_major.warmup_steps=1", "emulator.trace=false",
                "emulator.workers=1"]
        cmd = [binary, "run", os.path.join(root, "configs/flux1-tiny-24tiles.toml"), "--out", d, "-q"]
        for s in sets:
            cmd += ["--set", s]
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(cmd, capture_output=True, text=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed: {p.stderr}")
        rep = json.load(open(os.path.join(d, "report.json")))
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        return cpu, rep["timeline_sha256"], rep["virtual_time_s"]
res = {}
for rep in range(repeats):
    for strategy, nodes in cases:
        for name, b in (("before", before), ("after", after)):
            cpu, h, vt = run(b, strategy, nodes)
            res.setdefault((strategy, nodes), {}).setdefault(name, []).append((cpu, h, vt))
            print(f"rep {rep} {strategy} {nodes} nodes {name}: {cpu:.2f} s CPU", file=sys.stderr, flush=True)
print(f"{'strategy':<10}{'tiles':>6}{'before s':>10}{'after s':>9}{'after/before':>14}  same timeline")
for (strategy, nodes), v in res.items():
    b = statistics.median(x[0] for x in v["before"]); a = statistics.median(x[0] for x in v["after"])
    same = {x[1] for x in v["before"]} == {x[1] for x in v["after"]} and len({x[1] for x in v["after"]}) == 1
    print(f"{strategy:<10}{nodes * 12:>6}{b:>10.2f}{a:>9.2f}{a / b:>14.3f}  {'yes' if same else 'NO'}")
