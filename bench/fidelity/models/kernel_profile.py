#!/usr/bin/env python3
"""The device time of one transformer forward by CUDA kernel, for one model of forwards.py.

Usage: python3 bench/fidelity/models/kernel_profile.py OUT --diffusers SRC_DIR --model NAME
       --width W --height H [--frames F] [--batch 1]

Builds the model as forwards.py does (published config, random bf16 weights on the GPU, eval,
inference mode, default attention dispatch; inputs as its pipeline shapes them), runs 2 warm-up
forwards, then one under torch.profiler (CUDA activity). Writes OUT/kernels.csv (kernel name,
calls, total device us, share of the forward's kernel time), sorted by time, and prints the top 25.
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forwards  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--diffusers", required=True)
    ap.add_argument("--model", required=True, choices=forwards.ORDER)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--height", type=int, required=True)
    ap.add_argument("--frames", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    src = os.path.abspath(a.diffusers)
    spec = dict(forwards.FAMILIES[a.model])
    spec["cfg"] = forwards.config_of(spec, False, a.width, a.height)
    klass, _ = forwards.import_class(src, spec["module"], spec["cls"])
    model, _ = forwards.build(torch, klass, spec["cfg"])
    dev = torch.device("cuda")
    with torch.inference_mode():
        kw, tokens = forwards.make_inputs(torch, a.model, spec, a.batch, a.width, a.height, dev, a.frames)
        for _ in range(2):
            model(**kw)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(**kw)
            torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        r = rows.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += e.device_time if hasattr(e, "device_time") else e.cuda_time
    total = sum(v[1] for v in rows.values())
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "kernels.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "calls", "total_us", "share"])
        for name, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
            w.writerow([name[:300], n, f"{us:.1f}", f"{us / total:.4f}"])
    print(f"{a.model} {a.width}x{a.height} f{a.frames} b{a.batch}: {tokens} tokens, kernel time "
          f"{total / 1e3:.2f} ms over {sum(v[0] for v in rows.values())} kernels")
    for name, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"{us / 1e3:9.2f} ms {n:6d}x  {name[:140]}")


if __name__ == "__main__":
    main()
