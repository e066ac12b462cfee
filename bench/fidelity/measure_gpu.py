#!/usr/bin/env python3
"""Single-GPU microbenchmarks that calibrate cocodiff's device and collective models.

Measures, in bf16 and with CUDA events (median of timed repetitions after warm-ups):
  kernels.csv       FLUX.1-dev double/single block kernels at per-rank token counts 256..16384
                    (fused and split QKV GEMMs, Q/K RMSNorm and RoPE as unfused eager kernels and
                    as fused ones, SDPA attention at Ulysses per-rank head counts, MLP, adaLN)
  nccl.csv          single-rank NCCL calls (all_to_all_single, all_gather, all_reduce) 1 KiB..1 GiB:
                    one rank moves nothing over a link, so this is the per-call software floor
  copy.csv          device-to-device copy bandwidth (copy engine and an SM copy kernel)
  interference.json a large GEMM with a copy kernel in flight on another stream, and alone
  env.json          GPU, driver, CUDA, PyTorch, NCCL versions and the date
Usage: python3 measure_gpu.py OUT_DIR [--budget-s 330]
"""
import argparse, csv, datetime, json, os, subprocess

from cocodiff_fidelity.budget import Budget
from cocodiff_fidelity.lazy import F, torch

dev = "cuda"
HID, HEADS, HD, MLP = 3072, 24, 128, 12288
TOKENS = [256, 512, 1024, 2048, 4096, 8192, 16384]


def bench(fn, min_reps=5, target_ms=60.0):
    """Median time of fn() in microseconds (CUDA events, 2 warm-ups)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); fn(); e.record(); torch.cuda.synchronize()
    one_ms = max(s.elapsed_time(e), 1e-3)
    reps = int(min(200, max(min_reps, target_ms / one_ms)))
    times = []
    for _ in range(reps):
        s.record(); fn(); e.record(); e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    times.sort()
    return times[len(times) // 2]


def env():
    info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "gpu": torch.cuda.get_device_name(0),
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,memory.total",
                                         "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except Exception as ex:  # noqa: BLE001
        info["driver"] = f"unknown ({ex})"
    return info


def rms_unfused(x, w):  # as diffusers' RMSNorm runs in eager mode: several kernels
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(var + 1e-6)).to(x.dtype) * w


def rope_unfused(x, cos, sin):  # diffusers apply_rotary_emb (use_real, unbind_dim=-1)
    xr, xi = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rot = torch.stack([-xi, xr], dim=-1).flatten(-2)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def kernels(rows, budget):
    w = {n: torch.randn(o, i, device=dev, dtype=torch.bfloat16) * 0.02 for n, (i, o) in {
        "qkv": (HID, 3 * HID), "qk": (HID, 2 * HID), "v": (HID, HID), "proj": (HID, HID),
        "mlp_up": (HID, MLP), "mlp_down": (MLP, HID), "single_in": (HID, 3 * HID + MLP),
        "single_out": (HID + MLP, HID)}.items()}
    nw = torch.ones(HD, device=dev, dtype=torch.bfloat16)
    for n in TOKENS:
        if budget.left() < 150:
            print("kernels: budget reached at", n, flush=True); break
        x = torch.randn(n, HID, device=dev, dtype=torch.bfloat16)
        xm = torch.randn(n, MLP, device=dev, dtype=torch.bfloat16)
        xs = torch.randn(n, HID + MLP, device=dev, dtype=torch.bfloat16)
        gemms = {"gemm_qkv_fused": (x, "qkv"), "gemm_qk": (x, "qk"), "gemm_v": (x, "v"),
                 "gemm_proj": (x, "proj"), "gemm_mlp_up": (x, "mlp_up"), "gemm_mlp_down": (xm, "mlp_down"),
                 "gemm_single_in": (x, "single_in"), "gemm_single_out": (xs, "single_out")}
        for op, (a, wn) in gemms.items():
            t = bench(lambda: F.linear(a, w[wn]))
            rows.append([op, n, HEADS, a.shape[1], w[wn].shape[0], t])
        rows.append(["gemm_qkv_split_v_then_qk", n, HEADS, HID, 3 * HID,
                     bench(lambda: (F.linear(x, w["v"]), F.linear(x, w["qk"])))])
        q = torch.randn(n, HEADS, HD, device=dev, dtype=torch.bfloat16)
        cos = torch.randn(n, 1, HD, device=dev, dtype=torch.float32)
        sin = torch.randn(n, 1, HD, device=dev, dtype=torch.float32)
        rows.append(["qk_rmsnorm_unfused", n, HEADS, HD, 2, bench(lambda: (rms_unfused(q, nw), rms_unfused(q, nw)))])
        rows.append(["qk_rmsnorm_fused", n, HEADS, HD, 2,
                     bench(lambda: (F.rms_norm(q, (HD,), nw, 1e-6), F.rms_norm(q, (HD,), nw, 1e-6)))])
        rows.append(["qk_rope_unfused", n, HEADS, HD, 2, bench(lambda: (rope_unfused(q, cos, sin), rope_unfused(q, cos, sin)))])
        mod = torch.randn(1, HID, device=dev, dtype=torch.bfloat16)
        rows.append(["adaln_layernorm_modulate", n, HEADS, HID, 1,
                     bench(lambda: F.layer_norm(x, (HID,)) * (1 + mod) + mod)])
        y = torch.randn(n, MLP, device=dev, dtype=torch.bfloat16)
        rows.append(["gelu_tanh", n, HEADS, MLP, 1, bench(lambda: F.gelu(y, approximate="tanh"))])
        rows.append(["residual_gate", n, HEADS, HID, 1, bench(lambda: x + mod * x)])
        del x, xm, xs, q, cos, sin, y
        print(f"kernels n={n} done at {budget.elapsed():.0f}s", flush=True)


def attention(rows, budget):
    # Ulysses: a rank holds heads/P heads over the whole sequence of S tokens.
    for s in TOKENS:
        for h in (3, 6, 12, 24):
            if budget.left() < 110:
                print("attention: budget reached", flush=True); return
            q = torch.randn(1, h, s, HD, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, h, s, HD, device=dev, dtype=torch.bfloat16)
            v = torch.randn(1, h, s, HD, device=dev, dtype=torch.bfloat16)
            rows.append(["attention_sdpa", s, h, HD, s, bench(lambda: F.scaled_dot_product_attention(q, k, v))])
        print(f"attention s={s} done at {budget.elapsed():.0f}s", flush=True)


def nccl(rows, budget):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29513")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    size = 1024
    while size <= (1 << 30) and budget.left() > 70:
        a = torch.empty(size // 2, device=dev, dtype=torch.bfloat16)
        b = torch.empty_like(a)
        rows.append(["all_to_all", 1, size, bench(lambda: dist.all_to_all_single(b, a), target_ms=30)])
        rows.append(["all_gather", 1, size, bench(lambda: dist.all_gather_into_tensor(b, a), target_ms=30)])
        rows.append(["all_reduce", 1, size, bench(lambda: dist.all_reduce(a), target_ms=30)])
        del a, b
        size *= 4
    dist.destroy_process_group()


def copies(rows, budget):
    size = 1 << 12
    while size <= (1 << 30) and budget.left() > 50:
        a = torch.empty(size, dtype=torch.uint8, device=dev); b = torch.empty_like(a)
        rows.append(["copy_engine_d2d", size, bench(lambda: b.copy_(a), target_ms=30)])
        a16 = a.view(torch.bfloat16); b16 = b.view(torch.bfloat16)
        rows.append(["sm_copy_kernel", size, bench(lambda: torch.mul(a16, 1, out=b16), target_ms=30)])
        del a, b
        size *= 4


def interference(res):
    n, k, m = 8192, HID, MLP
    a = torch.randn(n, k, device=dev, dtype=torch.bfloat16); w = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    src = torch.empty(256 << 20, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
    s16, d16 = src.view(torch.bfloat16), dst.view(torch.bfloat16)
    gemm = lambda: F.linear(a, w)
    res["gemm_shape"] = [n, k, m]
    res["copy_bytes"] = src.numel()
    res["gemm_alone_us"] = bench(gemm)
    for name, cp in (("copy_engine", lambda: dst.copy_(src)), ("sm_copy", lambda: torch.mul(s16, 1, out=d16))):
        res[f"{name}_alone_us"] = bench(cp)
        side = torch.cuda.Stream()
        # GEMMs on the main stream while copies run back to back on a side stream, and vice versa.
        g_reps = 40
        c_reps = int(g_reps * res["gemm_alone_us"] / res[f"{name}_alone_us"]) + 8
        for _ in range(2):
            torch.cuda.synchronize()
            s0, e0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s1, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(side):
                s1.record()
                for _ in range(c_reps):
                    cp()
                e1.record()
            s0.record()
            for _ in range(g_reps):
                gemm()
            e0.record()
            torch.cuda.synchronize()
        res[f"gemm_with_{name}_us"] = s0.elapsed_time(e0) * 1e3 / g_reps
        res[f"{name}_with_gemm_us"] = s1.elapsed_time(e1) * 1e3 / c_reps
        res[f"{name}_reps_overlapped"] = [g_reps, c_reps]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the measurement folder written")
    p.add_argument("--budget-s", type=float, default=330.0)
    a = p.parse_args(argv)
    budget = Budget(a.budget_s)
    out = a.out
    os.makedirs(out, exist_ok=True)
    e = env(); print(e, flush=True)
    json.dump(e, open(os.path.join(out, "env.json"), "w"), indent=1)
    torch.backends.cuda.matmul.allow_tf32 = False
    res = {}
    try:
        interference(res)
    except Exception as ex:  # noqa: BLE001
        res["error"] = repr(ex)
    json.dump(res, open(os.path.join(out, "interference.json"), "w"), indent=1)
    print(res, flush=True)
    rows = []
    try:
        kernels(rows, budget)
    except Exception as ex:  # noqa: BLE001
        print("kernels failed", repr(ex), flush=True)
    try:
        attention(rows, budget)
    except Exception as ex:  # noqa: BLE001
        print("attention failed", repr(ex), flush=True)
    with open(os.path.join(out, "kernels.csv"), "w", newline="") as f:
        wr = csv.writer(f); wr.writerow(["op", "tokens", "heads", "k", "n", "time_us"])
        wr.writerows([[r[0], r[1], r[2], r[3], r[4], f"{r[5]:.3f}"] for r in rows])
    crow = []
    try:
        copies(crow, budget)
    except Exception as ex:  # noqa: BLE001
        print("copies failed", repr(ex), flush=True)
    with open(os.path.join(out, "copy.csv"), "w", newline="") as f:
        wr = csv.writer(f); wr.writerow(["op", "bytes", "time_us"])
        wr.writerows([[r[0], r[1], f"{r[2]:.3f}"] for r in crow])
    nrow = []
    try:
        nccl(nrow, budget)
    except Exception as ex:  # noqa: BLE001
        print("nccl failed", repr(ex), flush=True)
    with open(os.path.join(out, "nccl.csv"), "w", newline="") as f:
        wr = csv.writer(f); wr.writerow(["op", "ranks", "bytes", "time_us"])
        wr.writerows([[r[0], r[1], r[2], f"{r[3]:.3f}"] for r in nrow])
    print(f"done in {budget.elapsed():.0f}s", flush=True)


if __name__ == "__main__":
    main()
