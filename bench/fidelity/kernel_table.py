#!/usr/bin/env python3
"""Turns measure_gpu.py's kernels.csv into [device.kernels.*] tables for a cluster preset.

Each cocodiff op label is matched to the kernel PyTorch runs for it, and keyed by the FLOPs
cocodiff charges for it (dit/layers.cpp): linear 2*N*in*out, RMSNorm 4*N*3072, RoPE 3*N*3072,
attention 4*heads*S*S*128. Q/K norm and RoPE were timed for Q and K together, so each label
gets half. Attention points with equal FLOPs (heads x S^2) are averaged in log time.
Usage: kernel_table.py kernels.csv SOURCE_NAME > table.toml
"""
import argparse
import math
from collections import defaultdict

from cocodiff_fidelity.readers import read_csv

HID, MLP = 3072, 12288


def linear_flops(i, o):
    return lambda n, h: 2.0 * n * i * o


# label -> (csv op, divisor, flops(tokens, heads))
MAP = {
    "q_proj": ("gemm_v", 1, linear_flops(HID, HID)), "k_proj": ("gemm_v", 1, linear_flops(HID, HID)),
    "v_proj": ("gemm_v", 1, linear_flops(HID, HID)), "attn_out": ("gemm_proj", 1, linear_flops(HID, HID)),
    "attn_add_out": ("gemm_proj", 1, linear_flops(HID, HID)),
    "mlp_fc1": ("gemm_mlp_up", 1, linear_flops(HID, MLP)), "mlp_fc2": ("gemm_mlp_down", 1, linear_flops(MLP, HID)),
    "proj_mlp": ("gemm_mlp_up", 1, linear_flops(HID, MLP)),
    "proj_out": ("gemm_single_out", 1, linear_flops(HID + MLP, HID)),
    "q_norm": ("qk_rmsnorm_unfused", 2, lambda n, h: 4.0 * n * HID),
    "k_norm": ("qk_rmsnorm_unfused", 2, lambda n, h: 4.0 * n * HID),
    "q_rope": ("qk_rope_unfused", 2, lambda n, h: 3.0 * n * HID),
    "k_rope": ("qk_rope_unfused", 2, lambda n, h: 3.0 * n * HID),
    "attention": ("attention_sdpa", 1, lambda s, h: 4.0 * h * s * s * 128),
}


def tables(rows, source):
    """The TOML text of every label's table from kernels.csv's rows."""
    text = []
    for label, (op, div, fl) in MAP.items():
        pts = defaultdict(list)
        for r in rows:
            if r["op"] == op:
                pts[fl(int(r["tokens"]), int(r["heads"]))].append(math.log(float(r["time_us"]) / div))
        if not pts:
            continue
        xs = sorted(pts)
        ts = [math.exp(sum(pts[x]) / len(pts[x])) for x in xs]
        text.append(f"[device.kernels.{label}]  # {op}" + (f" / {div}" if div > 1 else ""))
        text.append("flops = [" + ", ".join(f"{x:.6g}" for x in xs) + "]")
        text.append("time_us = [" + ", ".join(f"{t:.4g}" for t in ts) + "]")
        text.append(f'source = "{source}"\n')
    return "\n".join(text) + "\n" if text else ""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernels_csv")
    p.add_argument("source", help="the tables' source name")
    a = p.parse_args(argv)
    print(tables(read_csv(a.kernels_csv), a.source), end="")


if __name__ == "__main__":
    main()
