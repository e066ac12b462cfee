"""Kernels: device time (CUDA graph replay: the queue never drains) and host issue time of every
kernel a block issues (kernels.csv, host_<transport>.csv); a rank's Q preparation in head groups
(chunks.json); kernels warm, cold and sustained (pace.json)."""
import json
import statistics
import time

from ..lazy import F, dist, torch
from . import runtime as rt
from .runtime import left, log, rank_max, sync, waited
from .timing import Span, capture_graph, graph_time, host_time, time_calls
from .collectives import all_gather
from .flux import Rope, W, gelu, norm_mod, rms, rope, sdpa


def kernel_cases(n, h, tokens_txt=None):
    """(op, label, k, n_out, flops, fn) of the kernels a block issues for n tokens and h heads
    (labels are cocodiff's op labels, flops what cocodiff charges for them)."""
    x = torch.randn(n, rt.HID, device=rt.dev, dtype=rt.DT)
    xm = torch.randn(n, rt.MLP, device=rt.dev, dtype=rt.DT)
    xs = torch.randn(n, rt.HID + rt.MLP, device=rt.dev, dtype=rt.DT)
    w = {"qkv": W(rt.HID, rt.HID), "out": W(rt.HID, rt.HID), "fc1": W(rt.MLP, rt.HID), "fc2": W(rt.HID, rt.MLP),
         "po": W(rt.HID, rt.HID + rt.MLP), "mod": W(6 * rt.HID, rt.HID)}
    q = torch.randn(n, h, rt.HD, device=rt.dev, dtype=rt.DT)
    nw = torch.ones(rt.HD, device=rt.dev, dtype=rt.DT)
    rp = Rope(n)
    mod = torch.randn(1, rt.HID, device=rt.dev, dtype=rt.DT)
    temb = torch.randn(1, rt.HID, device=rt.dev, dtype=rt.DT)
    qkv_h = W(h * rt.HD, rt.HID)
    lin = lambda i, o: 2.0 * n * i * o
    return [
        ("linear", "q_proj", rt.HID, rt.HID, lin(rt.HID, rt.HID), lambda: F.linear(x, w["qkv"])),
        ("linear_heads", "q_proj_heads", rt.HID, h * rt.HD, lin(rt.HID, h * rt.HD), lambda: F.linear(x, qkv_h)),
        ("linear", "attn_out", rt.HID, rt.HID, lin(rt.HID, rt.HID), lambda: F.linear(x, w["out"])),
        ("linear", "mlp_fc1", rt.HID, rt.MLP, lin(rt.HID, rt.MLP), lambda: F.linear(x, w["fc1"])),
        ("linear", "mlp_fc2", rt.MLP, rt.HID, lin(rt.MLP, rt.HID), lambda: F.linear(xm, w["fc2"])),
        ("linear", "proj_out", rt.HID + rt.MLP, rt.HID, lin(rt.HID + rt.MLP, rt.HID), lambda: F.linear(xs, w["po"])),
        ("rms_norm", "q_norm", rt.HD, h, 4.0 * n * h * rt.HD, lambda: rms(q, nw)),
        ("rope", "q_rope", rt.HD, h, 3.0 * n * h * rt.HD, lambda: rope(q, rp.cos, rp.sin)),
        ("norm_modulate", "norm1", rt.HID, rt.HID, 7.0 * n * rt.HID, lambda: norm_mod(x, mod, mod)),
        ("gelu", "mlp_gelu", rt.MLP, rt.MLP, 8.0 * n * rt.MLP, lambda: gelu(xm)),
        ("gated_residual", "residual", rt.HID, rt.HID, 2.0 * n * rt.HID, lambda: x + mod * x),
        # the all-to-all's send layout for 2 peers: each peer's half of the heads made contiguous
        # (a view of one peer would be contiguous already, and .contiguous() would copy nothing)
        ("pack", "a2a_pack", rt.HID, h, 0.0,
         lambda: q.view(n, 2, h // 2, rt.HD).transpose(0, 1).contiguous() if h % 2 == 0 else q.clone()),
        ("unpack", "a2a_unpack", rt.HID, h, 0.0, lambda: q.permute(1, 0, 2).contiguous()),
        ("concat", "attn_mlp_concat", rt.HID, rt.MLP, 0.0, lambda: torch.cat([x, xm], -1)),
        ("adaln", "adaln", rt.HID, 6 * rt.HID, 2.0 * 6 * rt.HID * rt.HID, lambda: F.linear(temb, w["mod"])),
    ]


def kernels(rows):
    if rt.RANK != 0:
        return
    for n in rt.TOKENS:
        if left() < 200:
            log("kernels: deadline at", n)
            break
        for h in sorted({rt.HEADS, rt.HEADS // 2, rt.HEADS // 4}, reverse=True):
            if h != rt.HEADS and n not in (512, 4096, 16384 // 4, 16384 // 2):
                continue
            for op, label, k, no, fl, fn in kernel_cases(n, h):
                if h != rt.HEADS and op not in ("rms_norm", "rope", "linear_heads", "pack", "unpack"):
                    continue
                one, _ = time_calls(fn, 1, warm=2)
                reps = int(min(200, max(10, 20000.0 / max(one, 1.0))))
                rows.append([op, label, n, h, k, no, f"{fl:.6g}", f"{graph_time(fn, reps):.3f}", ""])
        for s in sorted({n + rt.TXT}):
            for h in (rt.HEADS, rt.HEADS // 2, rt.HEADS // 4, rt.HEADS // 8):
                if h < 1:
                    continue
                q = torch.randn(1, h, s, rt.HD, device=rt.dev, dtype=rt.DT)
                fn = lambda: sdpa(q, q, q)
                one, _ = time_calls(fn, 1, warm=2)
                reps = int(min(100, max(5, 20000.0 / max(one, 1.0))))
                rows.append(["sdpa", "attention", s, h, rt.HD, s, f"{4.0 * h * s * s * rt.HD:.6g}",
                             f"{graph_time(fn, reps):.3f}", ""])
        log(f"kernels n={n} done")
        if not rt.CPU:
            torch.cuda.empty_cache()


def host_costs(rows):
    """Host time per eager op, on small shapes so the GPU never holds the host back."""
    if rt.RANK != 0:
        return
    n = 64 if not rt.CPU else 8
    for op, label, k, no, fl, fn in kernel_cases(n, rt.HEADS):
        rows.append([op, label, n, rt.HEADS, k, no, f"{fl:.6g}", "", f"{host_time(fn):.3f}"])
    q = torch.randn(1, rt.HEADS, n, rt.HD, device=rt.dev, dtype=rt.DT)
    rows.append(["sdpa", "attention", n, rt.HEADS, rt.HD, n, "", "", f"{host_time(lambda: sdpa(q, q, q)):.3f}"])


def host_costs_collective(rows):
    """Host time to issue an async all_to_all_single / all_gather (every rank issues)."""
    if rt.WORLD < 2:
        return
    g = rt.WORLD_GROUP
    a = torch.empty(1024 * rt.WORLD, device=rt.dev, dtype=rt.DT)
    b = torch.empty_like(a)
    c = torch.empty(1024, device=rt.dev, dtype=rt.DT)
    for op, fn in (("all_to_all", lambda: dist.all_to_all_single(b, a, group=g, async_op=True).wait()),
                   ("all_gather", lambda: waited(all_gather(b[:1024 * rt.WORLD], c, g, async_op=True)))):
        for _ in range(5):
            fn()
        sync()
        dist.barrier()
        c0 = time.thread_time()
        for _ in range(100):
            fn()
        c1 = time.thread_time()
        sync()
        hu = rank_max((c1 - c0) * 1e6 / 100)
        if rt.RANK == 0:
            rows.append([op, op, 1024 * rt.WORLD * 2, rt.WORLD, 0, 0, "", "", f"{hu:.3f}"])


def chunk_prep(res):
    """A Ulysses rank's Q preparation whole against split into head groups, as Step.attend runs
    it (device time, CUDA graph): per chunk RMSNorm and RoPE on a strided slice of the
    projection and its all-to-all layout (transpose + contiguous); on the receiving side the
    groups concatenated and the text prepended. Apart: the norms alone on the strided slices
    (norm) and on contiguous copies of them (norm_contig), the RoPEs, the layouts. Rank 0 only;
    the shapes of W ranks at each resolution (n / W image tokens a rank, 24 / W heads)."""
    if rt.RANK != 0:
        return
    nw = torch.ones(rt.HD, device=rt.dev, dtype=rt.DT)
    cases = []
    for w in (2, 3, 4):
        for res_px in [int(r) for r in rt.args.resolutions.split(",")]:
            tokens = (res_px // 16) ** 2 if not rt.CPU else 64
            n_loc, hl = tokens // w, rt.HEADS // w
            for c in (1, 2, 4):
                if hl < c:
                    continue
                if left() < 20:
                    log("chunks: deadline")
                    res["cases"] = cases
                    return
                x = torch.randn(n_loc, w, hl, rt.HD, device=rt.dev, dtype=rt.DT)
                rp = Rope(n_loc)
                cos, sin = rp.cos.unsqueeze(1), rp.sin.unsqueeze(1)
                bounds = [(hl * i // c, hl * (i + 1) // c) for i in range(c)]
                sl = [x[:, :, a:b] for a, b in bounds]
                normed = [rms(v, nw) for v in sl]
                roped = [rope(v, cos, sin) for v in normed]
                recv = [v.transpose(0, 1).contiguous() for v in roped]
                txt = torch.randn(rt.TXT, hl, rt.HD, device=rt.dev, dtype=rt.DT)

                def send():
                    for v in sl:
                        rope(rms(v, nw), cos, sin).transpose(0, 1).contiguous()

                def assemble():
                    img = recv[0] if c == 1 else torch.cat(recv, dim=-2)
                    torch.cat([txt, img.reshape(w * n_loc, hl, rt.HD)], 0)

                def norm_only():
                    for v in sl:
                        rms(v, nw)

                contig = [v.contiguous() for v in sl]

                def norm_contig():
                    for v in contig:
                        rms(v, nw)

                def rope_only():
                    for v in normed:
                        rope(v, cos, sin)

                def layout_only():
                    for v in roped:
                        v.transpose(0, 1).contiguous()

                row = {"ranks": w, "resolution": res_px, "rank_tokens": n_loc, "heads": hl,
                       "chunks": c}
                for name, fn in (("send", send), ("assemble", assemble), ("norm", norm_only),
                                 ("norm_contig", norm_contig), ("rope", rope_only), ("layout", layout_only)):
                    one, _ = time_calls(fn, 1, warm=2)
                    reps = int(min(100, max(5, 20000.0 / max(one, 1.0))))
                    row[name + "_us"] = round(graph_time(fn, reps), 3)
                cases.append(row)
                log("chunks", json.dumps(row))
                del x, sl, normed, roped, recv, contig
                if not rt.CPU:
                    torch.cuda.empty_cache()
    res["cases"] = cases


def kernel_pace(res):
    """Why a step's kernels take longer than the tables time them (rank 0, one GPU): the kernels
    of a 4,608-token single block (a 1-GPU 1024^2 step's, and the projections of a 4-GPU 2048^2
    rank's; 24 heads) timed three ways. `warm_us` as the
    tables do (replayed back to back in a CUDA graph: the kernel finds its inputs and weights in
    the L2 cache); `cold_us` with the L2 cache flushed before each call (a graph of flush + kernel
    less a graph of the flush alone: a read of a buffer of 4x the L2); `sustained_us` the warm
    graph replayed back to back for `sustain_s` seconds, the median call of the last third (the
    GPU at the clocks and power a long step holds it to). Each phase's wall-clock span is kept
    (`t0`, `t1`, Unix seconds) to line up with the GPU's sampled clocks and power."""
    if rt.RANK != 0:
        return
    n = 4608 if not rt.CPU else 64
    sustain_s = 1.5 if not rt.CPU else 0.05
    l2 = getattr(torch.cuda.get_device_properties(rt.dev), "L2_cache_size", 50 << 20) if not rt.CPU else 1 << 20
    flush_buf = torch.empty(4 * l2 // 4, device=rt.dev, dtype=torch.float32).fill_(1.0)

    def flush():
        flush_buf.sum()

    cases = [c for c in kernel_cases(n, rt.HEADS) if c[0] not in ("linear_heads", "pack", "unpack", "adaln")]
    q = torch.randn(1, rt.HEADS, n, rt.HD, device=rt.dev, dtype=rt.DT)
    cases.append(("sdpa", "attention", rt.HD, n, 4.0 * rt.HEADS * n * n * rt.HD, lambda: sdpa(q, q, q)))
    res.update({"tokens": n, "heads": rt.HEADS, "l2_bytes": l2, "flush_bytes": flush_buf.numel() * 4,
                "sustain_s": sustain_s, "kernels": []})
    try:
        res["sm_clock_mhz_idle"] = torch.cuda.clock_rate(rt.dev) if not rt.CPU else None
    except Exception as ex:  # noqa: BLE001 (pynvml may be missing)
        res["sm_clock_mhz_idle"] = f"unavailable ({ex})"
    for op, label, k, no, fl, fn in cases:
        if left() < 30:
            log("pace: deadline")
            break
        row = {"op": op, "label": label, "flops": fl, "t0": time.time()}
        one, _ = time_calls(fn, 1, warm=2)
        reps = int(min(200, max(10, 20000.0 / max(one, 1.0))))
        row["warm_us"] = round(graph_time(fn, reps), 3)

        def flushed():
            flush()
            fn()

        row["flush_us"] = round(graph_time(flush, reps), 3)
        row["cold_us"] = round(graph_time(flushed, reps) - row["flush_us"], 3)
        if rt.CPU:
            t, _ = time_calls(fn, reps)
            row["sustained_us"] = row["first_replay_us"] = round(t, 3)
        else:
            g = capture_graph(fn, reps, warm=1)
            sync()
            spans, t_end = [], time.time() + sustain_s
            while time.time() < t_end or len(spans) < 6:
                sp = Span()
                sp.start()
                g.replay()
                sp.stop()
                spans.append(sp)
                if len(spans) % 8 == 0:
                    spans[-1].b.synchronize()
            sync()
            per = [sp.us() / reps for sp in spans]
            row["first_replay_us"] = round(per[0], 3)
            row["sustained_us"] = round(statistics.median(per[-max(2, len(per) // 3):]), 3)
            row["replays"] = len(per)
            del g
        row["t1"] = time.time()
        res["kernels"].append(row)
        log("pace", json.dumps({k: v for k, v in row.items() if k not in ("t0", "t1")}))
    del flush_buf, q
    if not rt.CPU:
        torch.cuda.empty_cache()
