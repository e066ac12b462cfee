#!/usr/bin/env python3
"""Shape-keyed kernel grids for one GPU: GEMMs, attention and memory-bound ops of the shipped DiT
families (FLUX.1-dev, FLUX.2-dev, SD3.5 Large and Medium, Qwen-Image, DiT-XL/2), in bf16.

Usage: python3 bench/fidelity/models/microbench.py OUT [--budget-s 420] [--quick] [--device cuda|cpu]
       [--sections gemm,attention,memory] [--plan]

Writes OUT/gemm.csv, OUT/attention.csv, OUT/memory.csv and OUT/env.json (columns in README.md).
Each point: CUDA events around each call, 2 warm-ups (1 for calls of 20 ms or more), then as many
timed repetitions as fill about 20 ms (3 to 50); median, min and max of them. Calls shorter than
4x the host's issue time are queued behind a sleeping kernel so that the events time the device
alone. The L2 cache is NOT flushed between repetitions: operands that fit in L2 (50 MB on H200)
are read from it on the second and later repetitions. Points run from the cheapest estimate to the
dearest within each section; a section that reaches its share of --budget-s stops there and
env.json lists what it left out.

GEMM shapes, y[m, n] = F.linear(x[m, k], w[n, k], bias). Sources: configs/models/*.toml and the
diffusers transformer classes (transformer_flux.py, transformer_flux2.py, transformer_sd3.py,
transformer_qwenimage.py, dit_transformer_2d.py, attention.py FeedForward, normalization.py).
m kinds: tokens = the token grid M_TOKENS (per-rank image (+ text) tokens x batch), text = M_TEXT
(text tokens x batch, and their Ulysses shards), batch = 1 and 2 (timestep / modulation vectors).

  n      k      m kind  bias  family: layer
  3072   3072   tokens  yes   FLUX.1, Qwen-Image: to_q/to_k/to_v, add_{q,k,v}_proj, to_out.0, to_add_out
                              (hidden 24 x 128 = 3072); FLUX.1 single to_q/k/v
  3072   3072   batch   yes   FLUX.1 time_text_embed linear_2 (timestep, guidance, pooled)
  9216   3072   tokens  yes   FLUX.1/Qwen fused QKV (3 x 3072: BFL reference, cocodiff's model,
                              diffusers fuse_qkv_projections)
  9216   3072   batch   yes   FLUX.1 single-block AdaLayerNormZeroSingle (3 x 3072)
  6144   3072   tokens  yes   Q and K fused (2 x 3072: the split QKV of measure_gpu.py)
  6144   3072   batch   yes   FLUX.1/Qwen norm_out AdaLayerNormContinuous (2 x 3072)
  12288  3072   tokens  yes   FLUX.1/Qwen ff.net.0.proj (mlp_ratio 4: 12288), FLUX.1 single proj_mlp
  3072   12288  tokens  yes   FLUX.1/Qwen ff.net.2
  21504  3072   tokens  yes   FLUX.1 single-block fused in (3 x 3072 + 12288; BFL linear1)
  3072   15360  tokens  yes   FLUX.1 single proj_out (3072 + 12288 -> 3072)
  18432  3072   batch   yes   FLUX.1 AdaLayerNormZero norm1/norm1_context, Qwen img_mod/txt_mod (6 x 3072)
  3072   4096   text    yes   FLUX.1 context_embedder (T5 joint_attention_dim 4096)
  3072   3584   text    yes   Qwen-Image txt_in (joint_attention_dim 3584)
  3072   64     tokens  yes   FLUX.1 x_embedder, Qwen img_in (16 channels x 2x2 packed = 64)
  64     3072   tokens  yes   FLUX.1/Qwen proj_out (2x2 x 16)
  3072   256    batch   yes   FLUX.1/Qwen timestep linear_1 (256 sinusoidal channels)
  3072   768    batch   yes   FLUX.1 pooled text_embedder linear_1 (CLIP 768)
  6144   6144   tokens  no    FLUX.2 to_q/k/v, add_*_proj, to_out.0, to_add_out (48 x 128 = 6144)
  18432  6144   tokens  no    FLUX.2 fused QKV (3 x 6144)
  18432  6144   batch   no    FLUX.2 single_stream_modulation (3 x 6144)
  36864  6144   tokens  no    FLUX.2 ff.linear_in (SwiGLU, mlp_ratio 3: 2 x 18432)
  36864  6144   batch   no    FLUX.2 double_stream_modulation_img/_txt (2 sets x 3 x 6144)
  6144   18432  tokens  no    FLUX.2 ff.linear_out
  55296  6144   tokens  no    FLUX.2 single to_qkv_mlp_proj (3 x 6144 + 2 x 18432)
  6144   24576  tokens  no    FLUX.2 single to_out (6144 + 18432)
  6144   15360  text    no    FLUX.2 context_embedder (joint_attention_dim 15360)
  6144   128    tokens  no    FLUX.2 x_embedder (32 channels x 2x2 packed = 128)
  128    6144   tokens  no    FLUX.2 proj_out
  12288  6144   batch   no    FLUX.2 norm_out (2 x 6144)
  6144   256    batch   no    FLUX.2 timestep_embedder linear_1
  2432   2432   tokens  yes   SD3.5 Large to_q/k/v, add_*_proj, to_out.0, to_add_out (38 x 64 = 2432)
  7296   2432   tokens  yes   SD3.5 Large fused QKV (3 x 2432)
  9728   2432   tokens  yes   SD3.5 Large ff.net.0.proj (4 x 2432)
  2432   9728   tokens  yes   SD3.5 Large ff.net.2
  2432   4096   text    yes   SD3.5 Large context_embedder (4096 -> caption_projection_dim 2432)
  2432   64     tokens  yes   SD3.5 Large pos_embed patch conv as a GEMM (16 channels x 2x2)
  64     2432   tokens  yes   SD3.5 Large proj_out
  14592  2432   batch   yes   SD3.5 Large AdaLayerNormZero (6 x 2432)
  4864   2432   batch   yes   SD3.5 Large norm_out, last block's context AdaLayerNormContinuous (2 x 2432)
  2432   2048   batch   yes   SD3.5 Large pooled text_embedder linear_1 (pooled_projection_dim 2048)
  1536   1536   tokens  yes   SD3.5 Medium attention projections (24 x 64 = 1536)
  4608   1536   tokens  yes   SD3.5 Medium fused QKV (3 x 1536)
  6144   1536   tokens  yes   SD3.5 Medium ff.net.0.proj (4 x 1536)
  1536   6144   tokens  yes   SD3.5 Medium ff.net.2
  1536   4096   text    yes   SD3.5 Medium context_embedder
  1536   64     tokens  yes   SD3.5 Medium pos_embed patch conv as a GEMM
  64     1536   tokens  yes   SD3.5 Medium proj_out
  9216   1536   batch   yes   SD3.5 Medium AdaLayerNormZero (6 x 1536)
  13824  1536   batch   yes   SD3.5 Medium AdaLayerNormZeroX of the dual-attention blocks 0-12 (9 x 1536)
  3072   1536   batch   yes   SD3.5 Medium norm_out (2 x 1536)
  1152   1152   tokens  yes   DiT-XL/2 to_q/k/v, to_out.0 (16 x 72 = 1152, attention_bias)
  3456   1152   tokens  yes   DiT-XL/2 fused QKV (3 x 1152; the reference DiT's qkv)
  4608   1152   tokens  yes   DiT-XL/2 ff.net.0.proj (4 x 1152)
  1152   4608   tokens  yes   DiT-XL/2 ff.net.2
  1152   16     tokens  yes   DiT-XL/2 pos_embed patch conv as a GEMM (4 channels x 2x2)
  32     1152   tokens  yes   DiT-XL/2 proj_out_2 (2x2 x 8, learn_sigma)
  6912   1152   batch   yes   DiT-XL/2 AdaLayerNormZero (6 x 1152)
  2304   1152   batch   yes   DiT-XL/2 proj_out_1 (2 x 1152)
  1152   256    batch   yes   DiT-XL/2 timestep linear_1

Token counts: image tokens (H/16) x (W/16) for 256^2..4096^2 (256..65536), plus text (FLUX,
FLUX.2, Qwen-Image 512; SD3.5 333 = 77 CLIP + 256 T5), over Ulysses degrees 1..96 and batch 1
and 2: m from 16 to 2 x (65536 + 512) = 132096.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

# ---- grids ----------------------------------------------------------------------------------------

def log_grid(lo_exp, hi_exp):
    """Powers of two 2^lo..2^hi and 1.5x between them."""
    out = []
    for e in range(lo_exp, hi_exp + 1):
        out.append(2 ** e)
        if e < hi_exp:
            out.append(3 * 2 ** (e - 1))
    return out


# per-rank image (+ text) tokens x batch; odd values: text-bearing and non-power-of-two ranks
M_ODD = [333, 1357, 4429, 4608, 5461, 16896, 66048, 132096]
M_TOKENS = sorted(set(log_grid(4, 17) + M_ODD))            # 16 .. 132096
M_TEXT = [16, 24, 32, 48, 64, 96, 128, 192, 256, 333, 384, 512, 666, 768, 1024]
M_BATCH = [1, 2]

# (n, k, m kind, bias variants, family: layer) -- the table of the docstring
GEMM_SHAPES = [
    (3072, 3072, "tokens", (0, 1), "flux1/qwen attention projections"),
    (3072, 3072, "batch", (0, 1), "flux1 time_text_embed linear_2"),
    (9216, 3072, "tokens", (0, 1), "flux1/qwen fused qkv"),
    (9216, 3072, "batch", (0, 1), "flux1 single AdaLayerNormZeroSingle"),
    (6144, 3072, "tokens", (0, 1), "flux1/qwen q+k fused"),
    (6144, 3072, "batch", (0, 1), "flux1/qwen norm_out"),
    (12288, 3072, "tokens", (0, 1), "flux1/qwen mlp up, flux1 single proj_mlp"),
    (3072, 12288, "tokens", (0, 1), "flux1/qwen mlp down"),
    (21504, 3072, "tokens", (0, 1), "flux1 single fused in"),
    (3072, 15360, "tokens", (0, 1), "flux1 single proj_out"),
    (18432, 3072, "batch", (0, 1), "flux1 AdaLayerNormZero, qwen img_mod/txt_mod"),
    (3072, 4096, "text", (0, 1), "flux1 context_embedder"),
    (3072, 3584, "text", (0, 1), "qwen txt_in"),
    (3072, 64, "tokens", (0, 1), "flux1 x_embedder, qwen img_in"),
    (64, 3072, "tokens", (0, 1), "flux1/qwen proj_out"),
    (3072, 256, "batch", (0, 1), "flux1/qwen timestep linear_1"),
    (3072, 768, "batch", (0, 1), "flux1 pooled text_embedder linear_1"),
    (6144, 6144, "tokens", (0,), "flux2 attention projections"),
    (18432, 6144, "tokens", (0,), "flux2 fused qkv"),
    (18432, 6144, "batch", (0,), "flux2 single_stream_modulation"),
    (36864, 6144, "tokens", (0,), "flux2 ff.linear_in (swiglu)"),
    (36864, 6144, "batch", (0,), "flux2 double_stream_modulation"),
    (6144, 18432, "tokens", (0,), "flux2 ff.linear_out"),
    (55296, 6144, "tokens", (0,), "flux2 single to_qkv_mlp_proj"),
    (6144, 24576, "tokens", (0,), "flux2 single to_out"),
    (6144, 15360, "text", (0,), "flux2 context_embedder"),
    (6144, 128, "tokens", (0,), "flux2 x_embedder"),
    (128, 6144, "tokens", (0,), "flux2 proj_out"),
    (12288, 6144, "batch", (0,), "flux2 norm_out"),
    (6144, 256, "batch", (0,), "flux2 timestep linear_1"),
    (2432, 2432, "tokens", (0, 1), "sd35-large attention projections"),
    (7296, 2432, "tokens", (0, 1), "sd35-large fused qkv"),
    (9728, 2432, "tokens", (0, 1), "sd35-large mlp up"),
    (2432, 9728, "tokens", (0, 1), "sd35-large mlp down"),
    (2432, 4096, "text", (0, 1), "sd35-large context_embedder"),
    (2432, 64, "tokens", (0, 1), "sd35-large patch conv as gemm"),
    (64, 2432, "tokens", (0, 1), "sd35-large proj_out"),
    (14592, 2432, "batch", (0, 1), "sd35-large AdaLayerNormZero"),
    (4864, 2432, "batch", (0, 1), "sd35-large norm_out"),
    (2432, 2048, "batch", (0, 1), "sd35-large pooled text_embedder linear_1"),
    (1536, 1536, "tokens", (0, 1), "sd35-medium attention projections"),
    (4608, 1536, "tokens", (0, 1), "sd35-medium fused qkv"),
    (6144, 1536, "tokens", (0, 1), "sd35-medium mlp up"),
    (1536, 6144, "tokens", (0, 1), "sd35-medium mlp down"),
    (1536, 4096, "text", (0, 1), "sd35-medium context_embedder"),
    (1536, 64, "tokens", (0, 1), "sd35-medium patch conv as gemm"),
    (64, 1536, "tokens", (0, 1), "sd35-medium proj_out"),
    (9216, 1536, "batch", (0, 1), "sd35-medium AdaLayerNormZero"),
    (13824, 1536, "batch", (0, 1), "sd35-medium AdaLayerNormZeroX"),
    (3072, 1536, "batch", (0, 1), "sd35-medium norm_out"),
    (1152, 1152, "tokens", (0, 1), "dit attention projections"),
    (3456, 1152, "tokens", (0, 1), "dit fused qkv"),
    (4608, 1152, "tokens", (0, 1), "dit mlp up"),
    (1152, 4608, "tokens", (0, 1), "dit mlp down"),
    (1152, 16, "tokens", (0, 1), "dit patch conv as gemm"),
    (32, 1152, "tokens", (0, 1), "dit proj_out_2"),
    (6912, 1152, "batch", (0, 1), "dit AdaLayerNormZero"),
    (2304, 1152, "batch", (0, 1), "dit proj_out_1"),
    (1152, 256, "batch", (0, 1), "dit timestep linear_1"),
]
M_BY_KIND = {"tokens": M_TOKENS, "text": M_TEXT, "batch": M_BATCH}

# attention: per-rank heads at every Ulysses degree that divides the family's head count
ATT_HEADS = {
    128: [1, 2, 3, 4, 6, 8, 12, 16, 24, 48],   # FLUX.1, Qwen-Image (24 heads), FLUX.2 (48 heads)
    64: [1, 2, 3, 4, 6, 8, 12, 19, 24, 38],    # SD3.5 Medium (24 heads), SD3.5 Large (38 heads)
    72: [1, 2, 4, 8, 16],                      # DiT-XL/2 (16 heads of 72)
}
# sequence = image + text tokens (Ulysses gathers the whole sequence): 256^2 DiT (256) .. 4096^2
# FLUX (65536 + 512); odd values: 256^2 + 333, 512^2 + 333, 1024x768 + 333 / + 512, 1024^2 + 333 /
# + 512, 2048^2 + 333 / + 512, 4096^2 + 512
ATT_ODD = [589, 1357, 3405, 3584, 4429, 4608, 16717, 16896, 66048]
ATT_TOKENS = sorted(set(log_grid(8, 16) + ATT_ODD))
ATT_BATCH = [1, 2]
ATT_CROSS = [  # (q_tokens, kv_tokens, heads, head_dim): q long, kv the text
    (q, 512, h, 128) for q in (4096, 16384, 65536) for h in (24, 3)] + [
    (q, 333, h, 64) for q in (4096, 16384, 65536) for h in (38, 24)]
ATT_PEAK = 500e12          # skip points whose flops at this rate exceed ATT_SKIP_S
ATT_SKIP_S = 0.050

# memory-bound ops: tokens T (batch 1) x hidden D of each family
MEM_TOKENS = sorted(set(log_grid(6, 17) + [4608, 16896, 66048]))    # 64 .. 131072
HIDDENS = [1152, 1536, 2432, 3072, 6144]       # DiT, SD3.5-M, SD3.5-L, FLUX.1/Qwen, FLUX.2
HEAD_DIM = {1152: 72, 1536: 64, 2432: 64, 3072: 128, 6144: 128}
TEXT_OF = {1536: 333, 2432: 333, 3072: 512, 6144: 512}
GELU_WIDTHS = [4608, 6144, 9728, 12288]        # DiT, SD3.5-M, SD3.5-L, FLUX.1/Qwen MLP hidden
LAYOUT_P = {1152: [2, 8], 1536: [2, 8], 2432: [2, 19], 3072: [2, 8], 6144: [2, 8]}
MEM_EXTRA = True    # the Qwen-Image text norm, FLUX.2's SwiGLU and the single blocks' feature concat


def quick_grids():
    global M_TOKENS, M_TEXT, M_BATCH, GEMM_SHAPES, ATT_HEADS, ATT_TOKENS, ATT_CROSS, ATT_BATCH
    global MEM_TOKENS, HIDDENS, GELU_WIDTHS, M_BY_KIND, MEM_EXTRA
    M_TOKENS, M_TEXT, M_BATCH = [16, 333, 4096], [512], [1]
    GEMM_SHAPES = [s for s in GEMM_SHAPES if (s[0], s[1], s[2]) in
                   {(3072, 3072, "tokens"), (18432, 3072, "batch"), (3072, 4096, "text"), (6144, 6144, "tokens")}]
    M_BY_KIND = {"tokens": M_TOKENS, "text": M_TEXT, "batch": M_BATCH}
    ATT_HEADS = {128: [3, 24], 64: [38]}
    ATT_TOKENS, ATT_BATCH = [256, 4608], [1]
    ATT_CROSS = [(4096, 512, 24, 128)]
    MEM_TOKENS, HIDDENS, GELU_WIDTHS, MEM_EXTRA = [256, 4096], [3072], [12288], False


# ---- estimates (for ordering, skipping and --plan) -----------------------------------------------

GEMM_PEAK, HBM_BPS, FLOOR_S, HOST_S = 700e12, 4.0e12, 4e-6, 12e-6


def point_wall_s(t_s, kernels=1):
    """Wall time the timer spends on a call of device time t_s: warm-ups, one probe, the reps."""
    reps = min(50, max(3, int(0.02 / max(t_s, 1e-6))))
    warm = 2 if t_s < 0.02 else 1
    return (warm + 1 + reps) * max(t_s, kernels * HOST_S) + 0.002


def gemm_points():
    pts = []
    for n, k, kind, biases, what in GEMM_SHAPES:
        for m in M_BY_KIND[kind]:
            for b in biases:
                flops = 2.0 * m * n * k
                byt = 2.0 * (m * k + n * k + m * n)
                est = max(flops / GEMM_PEAK, byt / HBM_BPS, FLOOR_S)
                pts.append((est, m, n, k, b, what))
    # one row per (m, n, k, bias): shapes listed twice (tokens and batch kinds) share a row
    seen, out = set(), []
    for p in sorted(pts):
        key = p[1:5]
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def attention_points():
    pts, skipped = [], []
    for d, heads in ATT_HEADS.items():
        for h in heads:
            for s in ATT_TOKENS:
                for b in ATT_BATCH:
                    pts.append((b, s, s, h, d))
    for q, kv, h, d in ATT_CROSS:
        pts.append((1, q, kv, h, d))
    out = []
    for b, q, kv, h, d in pts:
        flops = 4.0 * b * h * q * kv * d
        est = flops / ATT_PEAK
        if est > ATT_SKIP_S:
            skipped.append([b, q, kv, h, d])
            continue
        out.append((max(est * 1.4, FLOOR_S), b, q, kv, h, d))   # 1.4: below the skip rule's peak
    return sorted(out), skipped


def mem_specs():
    """(op, tokens, D, extra) for every memory point."""
    specs = []
    for t in MEM_TOKENS:
        for d in HIDDENS:
            for op in ("layernorm", "layernorm_affine", "silu", "add", "mul", "mul_bcast", "add_bcast",
                       "addcmul_bcast", "modulate_eager", "gated_residual_eager", "copy",
                       "transpose_bhsd_bshd"):
                specs.append((op, t, d, None))
            hd = HEAD_DIM[d]
            if d != 1152:  # DiT-XL/2 has no q/k norm and no RoPE
                specs.append(("rms_norm", t, d, hd))
                specs.append(("rms_norm_unfused", t, d, hd))
            if hd == 128:
                specs.append(("rope_real", t, d, hd))
            if d == 3072:
                specs.append(("rope_complex", t, d, hd))
            for p in LAYOUT_P[d]:
                specs.append(("layout_a2a", t, d, (hd, p)))
            if d in TEXT_OF:
                specs.append(("cat_seq", t, d, TEXT_OF[d]))
        for w in GELU_WIDTHS:
            specs.append(("gelu_tanh", t, w, None))
        if MEM_EXTRA:
            specs.append(("rms_norm", t, 3584, 3584))            # Qwen-Image txt_norm (3584)
            specs.append(("rms_norm_unfused", t, 3584, 3584))
            specs.append(("swiglu", t, 36864, None))              # FLUX.2 linear_in output
            specs.append(("cat_feat", t, 3072, 12288))            # FLUX.1 single: attn | mlp
            specs.append(("cat_feat", t, 6144, 18432))            # FLUX.2 single
    return specs


# per element of the main tensor (x = tokens x D, bf16): bytes read + written by each kernel
# of the op, and its kernel count; see mem_op() for the kernels.
MEM_BYTES_PER_ELEM = {
    "layernorm": (4, 1), "layernorm_affine": (4, 1), "silu": (4, 1), "add": (6, 1), "mul": (6, 1),
    "mul_bcast": (4, 1), "add_bcast": (4, 1), "addcmul_bcast": (6, 1), "modulate_eager": (8, 3),
    "gated_residual_eager": (10, 2), "copy": (4, 1), "transpose_bhsd_bshd": (4, 1),
    "rms_norm": (4, 1), "rms_norm_unfused": (34, 8), "rope_real": (52, 8), "rope_complex": (20, 3),
    "layout_a2a": (4, 1), "cat_seq": (4, 1), "gelu_tanh": (4, 1), "swiglu": (5, 2), "cat_feat": (4, 1),
}


def mem_estimate(op, t, d, extra):
    per, kern = MEM_BYTES_PER_ELEM[op]
    elems = t * d
    if op == "cat_seq":
        elems = (t + extra) * d
    if op == "cat_feat":
        elems = t * (d + extra)
    return max(per * elems / HBM_BPS * 1.3, kern * FLOOR_S), kern


# ---- runners -------------------------------------------------------------------------------------

def run_gemm(torch, F, dev, timer, budget, out, env):
    pts = gemm_points()
    csv = bc.CsvOut(os.path.join(out, "gemm.csv"), ["m", "n", "k", "dtype", "bias", "us_median", "us_min",
                                                    "us_max", "reps"])
    dt = torch.bfloat16
    maxm = {}
    for _, m, n, k, b, _w in pts:
        maxm[k] = max(maxm.get(k, 0), m)
    xs = {k: torch.randn(mm, k, device=dev, dtype=dt) for k, mm in maxm.items()}
    ws, bs = {}, {}
    left_out = []
    done = 0
    for est, m, n, k, b, what in pts:
        if budget.left("gemm") < point_wall_s(est) + 1.0:
            left_out.append([m, n, k, b, round(est * 1e6, 1)])
            continue
        if (n, k) not in ws:
            ws[(n, k)] = torch.randn(n, k, device=dev, dtype=dt) * 0.02
            bs[n] = torch.randn(n, device=dev, dtype=dt) * 0.02
        x, w, bias = xs[k][:m], ws[(n, k)], (bs[n] if b else None)
        try:
            med, lo, hi, reps = timer.time(lambda: F.linear(x, w, bias))
        except Exception as ex:  # noqa: BLE001
            env["errors"].append(f"gemm m={m} n={n} k={k} bias={b}: {ex!r}"[:400])
            torch.cuda.empty_cache() if dev.type == "cuda" else None
            continue
        csv.row([m, n, k, "bf16", b, med, lo, hi, reps])
        done += 1
        if done % 200 == 0:
            print(f"gemm {done}/{len(pts)} at {budget.elapsed():.0f}s", flush=True)
    csv.close()
    env["gemm"] = {"points_planned": len(pts), "points_run": done, "left_out_by_budget": left_out}
    del xs, ws, bs
    print(f"gemm: {done} points, {len(left_out)} left out by the budget, at {budget.elapsed():.0f}s", flush=True)


def run_attention(torch, F, dev, timer, budget, out, env):
    pts, skipped = attention_points()
    csv = bc.CsvOut(os.path.join(out, "attention.csv"), ["batch", "q_tokens", "kv_tokens", "heads", "head_dim",
                                                         "us_median", "us_min", "us_max", "reps"])
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    left_out, done = [], 0
    if sdpa is None:
        env["errors"].append("attention: torch.nn.functional.scaled_dot_product_attention missing in this torch")
        pts = []
    dt = torch.bfloat16
    for est, b, q, kv, h, d in pts:
        if budget.left("attention") < point_wall_s(est) + 1.0:
            left_out.append([b, q, kv, h, d, round(est * 1e6, 1)])
            continue
        try:
            qt = torch.randn(b, h, q, d, device=dev, dtype=dt)
            kt = torch.randn(b, h, kv, d, device=dev, dtype=dt)
            vt = torch.randn(b, h, kv, d, device=dev, dtype=dt)
            med, lo, hi, reps = timer.time(lambda: sdpa(qt, kt, vt))
        except Exception as ex:  # noqa: BLE001
            env["errors"].append(f"attention b={b} q={q} kv={kv} h={h} d={d}: {ex!r}"[:400])
            continue
        finally:
            qt = kt = vt = None
        csv.row([b, q, kv, h, d, med, lo, hi, reps])
        done += 1
        if done % 100 == 0:
            print(f"attention {done}/{len(pts)} at {budget.elapsed():.0f}s", flush=True)
    csv.close()
    env["attention"] = {"points_planned": len(pts), "points_run": done,
                        "skipped_over_50ms_at_500tflops": skipped, "left_out_by_budget": left_out}
    print(f"attention: {done} points, {len(skipped)} skipped (> {ATT_SKIP_S * 1e3:.0f} ms at "
          f"{ATT_PEAK / 1e12:.0f} TFLOP/s), {len(left_out)} left out by the budget, at {budget.elapsed():.0f}s",
          flush=True)


def rms_unfused(x, w, eps=1e-6):
    """diffusers normalization.RMSNorm.forward (weight in bf16): 8 kernels."""
    torch = sys.modules["torch"]
    var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    y = x * torch.rsqrt(var + eps)
    return y.to(w.dtype) * w


def rope_real(x, cos, sin):
    """diffusers embeddings.apply_rotary_emb(use_real=True, use_real_unbind_dim=-1, sequence_dim=1):
    x [B, S, H, D] bf16, cos/sin [S, D] fp32 (FLUX.1, FLUX.2)."""
    torch = sys.modules["torch"]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rot = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rot.float() * sin).to(x.dtype)


def rope_complex(x, freqs):
    """diffusers transformer_qwenimage.apply_rotary_emb_qwen(use_real=False): x [B, S, H, D] bf16,
    freqs [S, D/2] complex64 (Qwen-Image)."""
    torch = sys.modules["torch"]
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.unsqueeze(1)).flatten(3).type_as(x)


def mem_op(torch, F, dev, op, t, d, extra):
    """(fn, bytes_moved, strided, shape) for one memory point; bytes_moved sums every kernel's reads
    and writes (each operand at its own size, a broadcast operand once)."""
    dt = torch.bfloat16
    r = lambda *s: torch.randn(*s, device=dev, dtype=dt)  # noqa: E731
    n = t * d
    if op in ("layernorm", "layernorm_affine"):
        x = r(1, t, d)
        w, b = (r(d), r(d)) if op == "layernorm_affine" else (None, None)
        return (lambda: F.layer_norm(x, (d,), w, b, 1e-6)), 4 * n + (4 * d if w is not None else 0), 0, f"1x{t}x{d}"
    if op == "silu":
        x = r(1, t, d)
        return (lambda: F.silu(x)), 4 * n, 0, f"1x{t}x{d}"
    if op in ("add", "mul"):
        x, y = r(1, t, d), r(1, t, d)
        f = torch.add if op == "add" else torch.mul
        return (lambda: f(x, y)), 6 * n, 0, f"1x{t}x{d}"
    if op in ("mul_bcast", "add_bcast"):
        x, s = r(1, t, d), r(1, d)
        f = torch.mul if op == "mul_bcast" else torch.add
        return (lambda: f(x, s[:, None])), 4 * n + 2 * d, 0, f"1x{t}x{d}"
    if op == "addcmul_bcast":      # fused gated residual: h + g[:, None] * a
        h, g, a = r(1, t, d), r(1, d), r(1, t, d)
        return (lambda: torch.addcmul(h, g[:, None], a)), 6 * n + 2 * d, 0, f"1x{t}x{d}"
    if op == "modulate_eager":     # AdaLN: norm_x * (1 + scale[:, None]) + shift[:, None]
        x, sc, sh = r(1, t, d), r(1, d), r(1, d)
        return (lambda: x * (1 + sc[:, None]) + sh[:, None]), 8 * n + 8 * d, 0, f"1x{t}x{d}"
    if op == "gated_residual_eager":   # h + gate[:, None] * a
        h, g, a = r(1, t, d), r(1, d), r(1, t, d)
        return (lambda: h + g[:, None] * a), 10 * n + 2 * d, 0, f"1x{t}x{d}"
    if op == "copy":
        x = r(1, t, d)
        return (lambda: x.clone()), 4 * n, 0, f"1x{t}x{d}"
    if op == "transpose_bhsd_bshd":   # attention output [B,H,S,D] -> [B,S,H*D]
        hd = HEAD_DIM[d]
        x = r(1, d // hd, t, hd)
        return (lambda: x.transpose(1, 2).reshape(1, t, d)), 4 * n, 1, f"1x{d // hd}x{t}x{hd}"
    if op == "rms_norm":
        hd = extra
        x, w = r(1, t, d // hd, hd), r(hd)
        if not hasattr(F, "rms_norm"):
            return None, 0, 0, ""
        return (lambda: F.rms_norm(x, (hd,), w, 1e-6)), 4 * n + 2 * hd, 0, f"1x{t}x{d // hd}x{hd}"
    if op == "rms_norm_unfused":
        hd = extra
        x, w = r(1, t, d // hd, hd), r(hd)
        rows = n // hd
        # per element: to(fp32) 2+4, pow 4+4, mean reads 4, mul 2+4, to(bf16) 4+2, mul by w 2+2;
        # per row (4 bytes): mean writes 1, add 2, rsqrt 2, mul reads 1
        byt = 34 * n + 24 * rows + 2 * hd
        return (lambda: rms_unfused(x, w)), byt, 0, f"1x{t}x{d // hd}x{hd}"
    if op == "rope_real":
        hd = extra
        x = r(1, t, d // hd, hd)
        cos = torch.randn(t, hd, device=dev, dtype=torch.float32)
        sin = torch.randn(t, hd, device=dev, dtype=torch.float32)
        # neg 2, stack 4, x.float 6, *cos 8, rot.float 6, *sin 8, add 12, to bf16 6 (per element)
        return (lambda: rope_real(x, cos, sin)), 52 * n + 2 * 4 * t * hd, 0, f"1x{t}x{d // hd}x{hd}"
    if op == "rope_complex":
        hd = extra
        x = r(1, t, d // hd, hd)
        fr = torch.polar(torch.ones(t, hd // 2, device=dev), torch.randn(t, hd // 2, device=dev))
        # x.float 6, complex mul 8 (+freqs), type_as 6
        return (lambda: rope_complex(x, fr)), 20 * n + 8 * t * hd // 2, 0, f"1x{t}x{d // hd}x{hd}"
    if op == "layout_a2a":   # Ulysses all-to-all layout: [S, H, D] -> [P, S, H/P, D]
        hd, p = extra
        x = r(t, d // hd, hd)
        return ((lambda: x.reshape(t, p, d // hd // p, hd).transpose(0, 1).contiguous()), 4 * n, 1,
                f"{t}x{p}x{d // hd // p}x{hd}")
    if op == "cat_seq":
        txt, img = r(1, extra, d), r(1, t, d)
        return (lambda: torch.cat([txt, img], dim=1)), 4 * (t + extra) * d, 0, f"1x{extra}+{t}x{d}"
    if op == "gelu_tanh":
        x = r(1, t, d)
        return (lambda: F.gelu(x, approximate="tanh")), 4 * n, 0, f"1x{t}x{d}"
    if op == "swiglu":       # FLUX.2 Flux2SwiGLU: silu(x[..., :half]) * x[..., half:]
        x = r(1, t, d)
        half = d // 2
        return (lambda: F.silu(x[..., :half]) * x[..., half:]), 5 * n, 1, f"1x{t}x{d}"
    if op == "cat_feat":
        a, m = r(1, t, d), r(1, t, extra)
        return (lambda: torch.cat([a, m], dim=2)), 4 * t * (d + extra), 0, f"1x{t}x{d}+{extra}"
    raise ValueError(op)


def run_memory(torch, F, dev, timer, budget, out, env):
    specs = sorted((mem_estimate(*s), s) for s in mem_specs())
    csv = bc.CsvOut(os.path.join(out, "memory.csv"), ["op", "shape", "dtype", "bytes_moved", "strided",
                                                      "us_median", "us_min", "us_max", "reps"])
    left_out, done, missing = [], 0, set()
    for (est, kern), (op, t, d, extra) in specs:
        if budget.left("memory") < point_wall_s(est, kern) + 1.0:
            left_out.append([op, t, d, str(extra), round(est * 1e6, 1)])
            continue
        try:
            fn, byt, strided, shape = mem_op(torch, F, dev, op, t, d, extra)
            if fn is None:
                missing.add(op)
                continue
            med, lo, hi, reps = timer.time(fn, kernels=kern)
        except Exception as ex:  # noqa: BLE001
            env["errors"].append(f"memory {op} t={t} d={d} {extra}: {ex!r}"[:400])
            continue
        finally:
            fn = None
        csv.row([op, shape, "bf16", int(byt), strided, med, lo, hi, reps])
        done += 1
        if done % 300 == 0:
            print(f"memory {done}/{len(specs)} at {budget.elapsed():.0f}s", flush=True)
    csv.close()
    env["memory"] = {"points_planned": len(specs), "points_run": done, "left_out_by_budget": left_out,
                     "ops_missing_in_this_torch": sorted(missing)}
    print(f"memory: {done} points, {len(left_out)} left out by the budget, at {budget.elapsed():.0f}s", flush=True)


def grid_definition(args):
    return {
        "dtype": "bf16", "timing": "CUDA events per call; warm-ups 2 (1 for calls >= 20 ms) + 1 probe; "
                                   "reps fill ~20 ms (3..50); short calls queued behind torch.cuda._sleep",
        "l2_flushed": False,
        "quick": args.quick,
        "gemm": {"call": "torch.nn.functional.linear(x[m,k], w[n,k], bias)", "m_tokens": M_TOKENS,
                 "m_text": M_TEXT, "m_batch": M_BATCH,
                 "shapes": [{"n": n, "k": k, "m_kind": kind, "bias": list(b), "what": w}
                            for n, k, kind, b, w in GEMM_SHAPES]},
        "attention": {"call": "torch.nn.functional.scaled_dot_product_attention(q, k, v), default dispatch, "
                              "[batch, heads, tokens, head_dim] contiguous",
                      "heads_by_head_dim": {str(k): v for k, v in ATT_HEADS.items()}, "tokens": ATT_TOKENS,
                      "batch": ATT_BATCH, "cross": ATT_CROSS,
                      "skip_rule": f"4*b*h*q*kv*d / {ATT_PEAK:.0f} FLOP/s > {ATT_SKIP_S} s"},
        "memory": {"tokens": MEM_TOKENS, "hiddens": HIDDENS, "head_dim": {str(k): v for k, v in HEAD_DIM.items()},
                   "gelu_widths": GELU_WIDTHS, "layout_p": {str(k): v for k, v in LAYOUT_P.items()},
                   "text_tokens": {str(k): v for k, v in TEXT_OF.items()},
                   "bytes_per_element_and_kernels": MEM_BYTES_PER_ELEM},
    }


def plan(args):
    g = gemm_points()
    a, skipped = attention_points()
    m = [mem_estimate(*s) for s in mem_specs()]
    gw = sum(point_wall_s(p[0]) for p in g)
    aw = sum(point_wall_s(p[0]) for p in a)
    mw = sum(point_wall_s(e, k) for e, k in m)
    print(f"gemm: {len(g)} points, estimated {gw:.0f} s on an H200 (device {sum(p[0] for p in g):.1f} s a pass)")
    print(f"attention: {len(a)} points ({len(skipped)} skipped by the 50 ms rule), estimated {aw:.0f} s")
    print(f"memory: {len(m)} points, estimated {mw:.0f} s")
    print(f"total estimated {gw + aw + mw:.0f} s (budget {args.budget_s:.0f} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--quick", action="store_true", help="a handful of points per grid (smoke run)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (checks the script's logic only)")
    ap.add_argument("--sections", default="gemm,attention,memory")
    ap.add_argument("--plan", action="store_true", help="print the grid's size and estimated time, run nothing")
    args = ap.parse_args()
    if args.quick:
        quick_grids()
    if args.plan:
        plan(args)
        return
    import torch
    import torch.nn.functional as F
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("microbench: no CUDA device (use --device cpu to check the script)")
    torch.manual_seed(0)
    sections = [s for s in args.sections.split(",") if s]
    share = {"gemm": 0.45, "attention": 0.35, "memory": 0.20}
    budget = bc.Budget(args.budget_s, [(s, share[s] / sum(share[x] for x in sections)) for s in sections])
    timer = bc.Timer(torch, dev)
    env = bc.env_info(torch, dev)
    env.update({"script": "bench/fidelity/models/microbench.py", "argv": sys.argv[1:], "budget_s": args.budget_s,
                "sleep_cycles_per_us": timer.cycles_per_us, "errors": [], "grid": grid_definition(args)})
    bc.write_json(os.path.join(args.out, "env.json"), env)
    print({k: env.get(k) for k in ("gpu", "sm_count", "driver", "torch", "cuda", "clocks_before")}, flush=True)
    runners = {"gemm": run_gemm, "attention": run_attention, "memory": run_memory}
    with torch.inference_mode():
        for s in sections:
            try:
                runners[s](torch, F, dev, timer, budget, args.out, env)
            except Exception as ex:  # noqa: BLE001
                env["errors"].append(f"{s} section failed: {ex!r}"[:400])
                print(f"{s} failed: {ex!r}", flush=True)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            bc.write_json(os.path.join(args.out, "env.json"), env)
    if dev.type == "cuda":
        env["clocks_after"] = bc.smi_query(bc.CLOCK_FIELDS)
        env["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
    env["wall_s"] = round(budget.elapsed(), 1)
    env["budget_reached"] = any(env.get(s, {}).get("left_out_by_budget") for s in sections)
    bc.write_json(os.path.join(args.out, "env.json"), env)
    print(f"microbench done in {budget.elapsed():.0f}s; errors: {len(env['errors'])}", flush=True)


if __name__ == "__main__":
    main()
