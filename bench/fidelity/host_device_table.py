#!/usr/bin/env python3
"""Turns measure_multi.py's kernels.csv (and host_*.csv of other machines) into the
[device.kernels.*] and [device.host] tables of a cluster preset.

Device times: each cocodiff op label takes the rows of the kernel PyTorch runs for it, keyed by
the FLOPs cocodiff charges for it (the `flops` column already is); points of equal FLOPs are
averaged in log time. Host times: each label takes the measured host issue time of the code
PyTorch runs for it (median over the machines given); labels cocodiff charges as two ops where
PyTorch runs one function (LayerNorm and modulation) split it as stated below.
Usage: host_device_table.py kernels.csv [host_other_machine.csv ...] > tables.toml
(the GPU's name comes from env_nvlink.json beside kernels.csv)
"""
import csv, json, math, os, statistics, sys
from collections import defaultdict

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
env = os.path.join(os.path.dirname(sys.argv[1]), "env_nvlink.json")
GPU = json.load(open(env)).get("gpu", "GPU") if os.path.exists(env) else "GPU"
SOURCE = (f"{os.path.relpath(os.path.abspath(sys.argv[1]), ROOT)} ({GPU}, PyTorch eager, bf16, "
          "CUDA graph replay)")
rows = list(csv.DictReader(open(sys.argv[1])))
host_rows = rows + [r for f in sys.argv[2:] for r in csv.DictReader(open(f))]

# label -> kernels.csv (op, label) rows whose device times make its table
DEVICE = {
    "q_proj": [("linear", "q_proj"), ("linear_heads", "q_proj_heads")],
    "attn_out": [("linear", "attn_out")],
    "mlp_fc1": [("linear", "mlp_fc1")], "mlp_fc2": [("linear", "mlp_fc2")],
    "proj_out": [("linear", "proj_out")],
    "q_norm": [("rms_norm", "q_norm")], "q_rope": [("rope", "q_rope")],
    "attention": [("sdpa", "attention")],
}
ALIAS = {"k_proj": "q_proj", "v_proj": "q_proj", "attn_add_out": "attn_out", "proj_mlp": "mlp_fc1",
         "k_norm": "q_norm", "k_rope": "q_rope"}


def host(op):
    v = [float(r["host_us"]) for r in host_rows if r["op"] == op and r["host_us"]]
    return statistics.median(v)


out = []
for label in list(DEVICE) + list(ALIAS):
    src = DEVICE[ALIAS.get(label, label)]
    pts = defaultdict(list)
    for r in rows:
        if (r["op"], r["label"]) in src and r["device_us"] and float(r["flops"]) > 0:
            pts[float(r["flops"])].append(math.log(float(r["device_us"])))
    xs = sorted(pts)
    ts = [math.exp(sum(pts[x]) / len(pts[x])) for x in xs]
    out.append(f"[device.kernels.{label}]  # " + ", ".join(f"{o} {l}" for o, l in src))
    out.append("flops = [" + ", ".join(f"{x:.6g}" for x in xs) + "]")
    out.append("time_us = [" + ", ".join(f"{t:.4g}" for t in ts) + "]")
    out.append(f'source = "{SOURCE}"\n')

linear = host("linear")
norm = host("rms_norm")  # one normalisation kernel, as F.layer_norm is
ops = {
    # projections: F.linear
    **{l: linear for l in ("q_proj", "k_proj", "v_proj", "attn_out", "attn_add_out", "mlp_fc1",
                           "mlp_fc2", "proj_mlp", "proj_out", "x_embedder", "context_embedder",
                           "embed_fc1", "embed_fc2")},
    "adaln": host("adaln"),
    "q_norm": norm, "k_norm": norm,
    "q_rope": host("rope"), "k_rope": host("rope"),
    "attention": host("sdpa"),
    "mlp_gelu": host("gelu"), "residual": host("gated_residual"),
    # LayerNorm + modulation is one PyTorch function (norm_modulate); cocodiff charges the
    # LayerNorm under the norm's label and the modulation apart: the norm takes one
    # normalisation kernel's cost, the modulation the rest
    **{l: norm for l in ("norm", "norm1", "norm1_context", "norm2", "norm2_context", "norm_out")},
    "modulate": host("norm_modulate") - norm,
    # Ulysses layout changes: a permute + contiguous copy
    "a2a_pack": host("unpack"), "a2a_unpack": host("unpack"), "gather_unpack": host("unpack"),
    "q_concat": host("concat"), "k_concat": host("concat"), "v_concat": host("concat"),
    "attn_mlp_concat": host("concat"),
    "o_split": host("pack"),  # views only: the cost of a view and a no-op contiguous()
}
out.append("[device.host]")
out.append(f"op_issue_us = {statistics.median(ops.values()):.3g}  # any other op: the median of those below")
coll = statistics.median([host("all_to_all"), host("all_gather")])
out.append(f"collective_issue_us = {coll:.3g}  # all_to_all_single / all_gather_into_tensor, issued and waited")
out.append("")
out.append("[device.host.ops]  # host time to issue each op in eager PyTorch (median over the machines measured)")
for k in sorted(ops):
    out.append(f"{k} = {ops[k]:.3g}")
print("\n".join(out))
