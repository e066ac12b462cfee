#!/usr/bin/env python3
"""Error of the hgx-h100 preset's roofline (before its kernel tables) against kernels.csv.
Roofline: max(flops / (989e12 * eff_c), bytes / (3350e9 * 0.8)) + 4 us, bf16 operands.
Usage: roofline_error.py configs/measurements/h100/kernels.csv"""
import argparse

from cocodiff_fidelity.readers import read_csv

PEAK, HBM, LAUNCH = 989e12, 3350e9, 4e-6
EFF = {"gemm": 0.7, "attention": 0.5}
HID, MLP = 3072, 12288


def lin(n, i, o):
    return ("gemm", 2.0 * n * i * o, 2.0 * (n * i + i * o + n * o))


OPS = {"gemm_v": lambda n, h: lin(n, HID, HID), "gemm_qkv_fused": lambda n, h: lin(n, HID, 3 * HID),
       "gemm_mlp_up": lambda n, h: lin(n, HID, MLP), "gemm_mlp_down": lambda n, h: lin(n, MLP, HID),
       "attention_sdpa": lambda s, h: ("attention", 4.0 * h * s * s * 128, 2.0 * 4 * h * s * 128),
       "qk_rmsnorm_unfused": lambda n, h: ("norm", 2 * 4.0 * n * HID, 2 * 2.0 * 2 * n * HID),
       "qk_rope_unfused": lambda n, h: ("norm", 2 * 3.0 * n * HID, 2 * 2.0 * 2 * n * HID)}


def table(rows):
    """The lines printed: every kernel of >= 4096 tokens, measured against the roofline."""
    lines = [f"{'op':22s} {'tokens':>6s} {'heads':>5s} {'measured_us':>11s} {'roofline_us':>11s} {'ratio':>6s}"]
    for r in rows:
        if r["op"] not in OPS or int(r["tokens"]) < 4096:
            continue
        kind, f, b = OPS[r["op"]](int(r["tokens"]), int(r["heads"]))
        # Two launches for the Q and K pair of norm / RoPE (one each as cocodiff charges them).
        launches = 2 if r["op"].startswith("qk_") else 1
        t = max(f / (PEAK * EFF.get(kind, 1.0)), b / (HBM * 0.8)) + launches * LAUNCH
        m = float(r["time_us"])
        lines.append(f"{r['op']:22s} {r['tokens']:>6s} {r['heads']:>5s} {m:11.1f} {t * 1e6:11.1f} {m / (t * 1e6):6.2f}")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernels_csv")
    a = p.parse_args(argv)
    print("\n".join(table(read_csv(a.kernels_csv))))


if __name__ == "__main__":
    main()
