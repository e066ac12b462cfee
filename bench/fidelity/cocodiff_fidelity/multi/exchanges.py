"""An exchange beside other work: compute beside an all-to-all in flight (interference), a
blocking call between kernels (blocking), the host issuing beside a busy stream (hostbeside), a
step's call forms (callforms) and the host's cost of one exchange part by part (hostx)."""
import math
import statistics
import time

from ..lazy import F, dist, torch
from . import runtime as rt
from .runtime import group_of, left, line_up, log, rank_any, rank_max, rank_min, sync, worlds
from .timing import Span, back_to_back_us, time_calls
from .flux import Rope, W, rms, rope, sdpa


def interference(res):
    if rt.WORLD < 2:
        return
    g = rt.WORLD_GROUP
    n = 4096 if not rt.CPU else 64
    x = torch.randn(n, rt.HID, device=rt.dev, dtype=rt.DT)
    w1 = W(rt.MLP, rt.HID)
    s = 16384 + rt.TXT if not rt.CPU else 64
    hq = torch.randn(1, rt.HEADS // rt.WORLD, s, rt.HD, device=rt.dev, dtype=rt.DT)
    q = torch.randn(n, rt.HEADS, rt.HD, device=rt.dev, dtype=rt.DT)
    nw = torch.ones(rt.HD, device=rt.dev, dtype=rt.DT)
    rp = Rope(n)
    computes = {"gemm_4096x3072x12288": lambda: F.linear(x, w1),
                "attention_sdpa": lambda: sdpa(hq, hq, hq),
                "qk_norm_rope": lambda: rope(rms(q, nw), rp.cos, rp.sin)}
    side = torch.cuda.Stream() if not rt.CPU else None
    res["world"] = rt.WORLD
    for mib in ((16, 256) if not rt.CPU else (1,)):
        send = torch.empty(mib * (1 << 20) // 2, device=rt.dev, dtype=rt.DT)
        recv = torch.empty_like(send)
        a2a = lambda: dist.all_to_all_single(recv, send, group=g)
        a2a_alone, _ = time_calls(a2a, 10)
        a2a_alone = rank_max(a2a_alone)
        res[f"all_to_all_{mib}MiB_alone_us"] = a2a_alone
        for name, fn in computes.items():
            if left() < 90:
                return
            alone, _ = time_calls(fn, 10)
            alone = rank_max(alone)
            res[f"{name}_alone_us"] = alone
            # as many compute calls as span the collectives, both sides several times over
            n_a2a = 8
            n_c = max(2, int(n_a2a * a2a_alone / max(alone, 1.0)))
            for rep in range(2):
                sync()
                dist.barrier()
                sync()
                spc, spa = Span(), Span(side)
                if rt.CPU:
                    spa.start(); [a2a() for _ in range(n_a2a)]; spa.stop()
                    spc.start(); [fn() for _ in range(n_c)]; spc.stop()
                else:
                    with torch.cuda.stream(side):
                        spa.start()
                        for _ in range(n_a2a):
                            a2a()
                        spa.stop()
                    spc.start()
                    for _ in range(n_c):
                        fn()
                    spc.stop()
                sync()
            both_c = rank_max(spc.us() / n_c)
            both_a = rank_max(spa.us() / n_a2a)
            res[f"{name}_with_a2a_{mib}MiB_us"] = both_c
            res[f"all_to_all_{mib}MiB_with_{name}_us"] = both_a
            res[f"{name}_with_a2a_{mib}MiB_calls"] = [n_c, n_a2a]
            log(f"interference {name} a2a {mib} MiB: compute {alone:.1f} -> {both_c:.1f} us, "
                f"a2a {a2a_alone:.1f} -> {both_a:.1f} us")


def blocking(res):
    """An all-to-all as a step issues it, between two compute kernels and waited for before the
    next one (CUDA events on the compute stream around each call), against the same call back
    to back (the sweeps' timing): what a blocking call's start-up costs that the sweeps hide,
    by size, on 2 and more GPUs."""
    res["world"] = rt.WORLD
    res["cases"] = []
    n = 4096 if not rt.CPU else 64
    x = torch.randn(n, rt.HID, device=rt.dev, dtype=rt.DT)
    wgt = W(rt.HID, rt.HID)
    iters = 20 if not rt.CPU else 3
    sizes = [1 << 20, 4 << 20, 16 << 20, 64 << 20] if not rt.CPU else [1 << 12, 1 << 14]
    for w in worlds():
        if w == 1:
            continue
        g = group_of(w)
        member = rt.RANK < w
        for nb in sizes:
            if rank_any(left() < 30):
                log("blocking: deadline at", w, nb)
                return
            out = {"gpus": w, "bytes": nb, "calls": iters}
            if member:
                send = torch.randn(nb // 2, device=rt.dev, dtype=rt.DT)
                recv = torch.empty_like(send)
                a2a = lambda: dist.all_to_all_single(recv, send, group=g)  # noqa: E731
                for _ in range(3):
                    a2a()
                line_up(g)
                b2b = back_to_back_us(a2a, iters)
                line_up(g)
                spans = []
                for _ in range(iters):
                    F.linear(x, wgt)
                    s2 = Span(torch.cuda.current_stream() if not rt.CPU else None)
                    s2.start()
                    a2a()
                    s2.stop()
                    spans.append(s2)
                F.linear(x, wgt)
                sync()
                between = statistics.median(sp2.us() for sp2 in spans)
            out["back_to_back_us"] = rank_max(b2b if member else 0.0)
            out["between_kernels_us"] = rank_max(between if member else 0.0)
            out["between_kernels_min_rank_us"] = rank_min(between if member else 1e30)
            res["cases"].append(out)
            log(f"blocking w={w} {nb} B: back to back {out['back_to_back_us']:.1f} us, between "
                f"kernels {out['between_kernels_min_rank_us']:.1f}-{out['between_kernels_us']:.1f} us")


def issue_beside(work, small, per, n_busy, side, g):
    """hostbeside's 5 repeats of n_busy busy calls (WORK on the SIDE stream; none: the idle
    GPU), each followed by PER small ops: the small ops' CPU and wall time per op (us), and the
    busy stream's device time over the loop's wall time."""
    cpu, wall, frac = [], [], []
    for rep in range(5):
        line_up(g)
        sp = Span(side) if work is not None else None
        ct = wt = 0.0
        w0 = time.perf_counter()
        if sp is not None and not rt.CPU:
            sp.start()
        for i in range(n_busy):
            if work is not None:
                if rt.CPU:
                    work()
                else:
                    with torch.cuda.stream(side):
                        work()
            c0, t0 = time.thread_time(), time.perf_counter()
            for _ in range(per):
                small()
            ct += time.thread_time() - c0
            wt += time.perf_counter() - t0
        if sp is not None and not rt.CPU:
            sp.stop()
        w1 = time.perf_counter()
        sync()
        cpu.append(ct * 1e6 / (per * n_busy))
        wall.append(wt * 1e6 / (per * n_busy))
        if sp is not None and not rt.CPU:
            frac.append(sp.us() / ((w1 - w0) * 1e6))
    return cpu, wall, frac


def hostbeside(res):
    """The host's cost to issue small eager ops (a 64-token 3072x3072 linear, about 14 us) while
    the device is busy on another stream, as in a pipelined step: every busy call (an
    all-to-all of 1 KiB, 4, 16 or 256 MiB per rank, whose shared-memory transport moves it
    through host memory; as the control, a 4096x3072x12288 GEMM) is followed by as many small
    ops as take the host about half the call's time alone, so that the busy stream never
    drains, against the same ops on an idle GPU. Per op: CPU time of the issuing thread and
    wall time (median of 5 repeats; slowest and least slowed rank); `busy_fraction` the busy
    stream's device time over the wall time of the loop (near 1: busy throughout)."""
    res["world"] = rt.WORLD
    res["cases"] = []
    xs = torch.randn(64 if not rt.CPU else 8, rt.HID, device=rt.dev, dtype=rt.DT)
    ws = W(rt.HID, rt.HID)
    small = lambda: F.linear(xs, ws)  # noqa: E731
    n_ops = 200 if not rt.CPU else 20
    big_x = torch.randn(4096 if not rt.CPU else 64, rt.HID, device=rt.dev, dtype=rt.DT)
    big_w = W(rt.MLP, rt.HID)
    side = torch.cuda.Stream() if not rt.CPU else None
    sizes = [1024, 4 << 20, 16 << 20, 256 << 20] if not rt.CPU else [1024]
    for w in worlds():
        if w == 1:
            continue
        g = group_of(w)
        member = rt.RANK < w
        for kind, nb in [("idle", 0)] + [("all_to_all", b) for b in sizes] + [("gemm", 0)]:
            if rank_any(left() < 30):
                log("hostbeside: deadline at", w, kind, nb)
                return
            out = {"gpus": w, "busy": kind, "bytes_per_rank": nb}
            cpu, wall, frac = [], [], []
            if member:
                if kind == "all_to_all":
                    send = torch.empty(nb // 2, device=rt.dev, dtype=rt.DT)
                    recv = torch.empty_like(send)
                    work = lambda: dist.all_to_all_single(recv, send, group=g)  # noqa: E731
                elif kind == "gemm":
                    work = lambda: F.linear(big_x, big_w)  # noqa: E731
                else:
                    work = None
                for _ in range(3):
                    small()
                    if work is not None:
                        work()
                line_up(g)
                alone = back_to_back_us(work, 5) if work is not None else 0.0
            # every member issues as many busy calls (the slowest rank's count)
            alone = rank_max(alone if member else 0.0)
            if member:
                per = max(1, int(alone / 2 / 15)) if work is not None else n_ops
                n_busy = max(4, math.ceil(n_ops / per)) if work is not None else 1
                out["busy_call_us"] = alone
                out["busy_calls"] = n_busy
                out["ops"] = per * n_busy
                cpu, wall, frac = issue_beside(work, small, per, n_busy, side, g)
            out["host_cpu_us"] = rank_max(statistics.median(cpu) if member else 0.0)
            out["host_cpu_min_rank_us"] = rank_min(statistics.median(cpu) if member else 1e30)
            out["host_wall_us"] = rank_max(statistics.median(wall) if member else 0.0)
            out["busy_fraction"] = rank_min(statistics.median(frac) if member and frac else 1e30)
            if out["busy_fraction"] > 1e29:
                out["busy_fraction"] = None
            res["cases"].append(out)
            log(f"hostbeside w={w} {kind} {nb} B: host {out['host_cpu_min_rank_us']:.1f}-"
                f"{out['host_cpu_us']:.1f} us CPU, {out['host_wall_us']:.1f} us wall per op; busy "
                f"fraction {out['busy_fraction']}")


def callforms(res):
    """The image all-to-all of a flat 2048^2 FLUX.1-dev step (its size on w GPUs), issued between
    two GEMMs and waited for, in four forms: blocking on fixed buffers (as `blocking` times it),
    async_op=True then wait() on fixed buffers, and both again with the send buffer made by the
    transpose-and-copy a step makes just before and a new receive buffer each call (as `Step`
    issues it); the last form again after six large GEMMs each time (async_fresh_hot: the GPU
    kept busy and hot, as in a step). CUDA events on the compute stream around each call; median
    call, least and most waiting rank; and the same call back to back."""
    res["world"] = rt.WORLD
    res["cases"] = []
    n = 4096 if not rt.CPU else 64
    x = torch.randn(n, rt.HID, device=rt.dev, dtype=rt.DT)
    wgt = W(rt.HID, rt.HID)
    big_x = torch.randn(4 * n, rt.HID, device=rt.dev, dtype=rt.DT)  # the MLP's up projection at 16k tokens
    big_w = W(rt.MLP, rt.HID)
    iters = 20 if not rt.CPU else 3
    for w in worlds():
        if w == 1:
            continue
        g = group_of(w)
        member = rt.RANK < w
        tokens = (2048 // 16) ** 2 if not rt.CPU else 256
        n_loc, hl = tokens // w, rt.HEADS // w
        out = {"gpus": w, "bytes": n_loc * rt.HID * 2, "calls": iters}
        for form in ("sync_fixed", "async_fixed", "sync_fresh", "async_fresh", "async_fresh_hot"):
            if rank_any(left() < 20):
                log("callforms: deadline at", w, form)
                return
            if member:
                src = torch.randn(n_loc, w, hl, rt.HD, device=rt.dev, dtype=rt.DT)
                fixed_send = src.transpose(0, 1).contiguous()
                fixed_recv = torch.empty_like(fixed_send)

                fresh = "fresh" in form

                def call():
                    send = src.transpose(0, 1).contiguous() if fresh else fixed_send
                    recv = torch.empty_like(send) if fresh else fixed_recv
                    return send, recv

                def issue(send, recv):
                    if form.startswith("async"):
                        dist.all_to_all_single(recv, send, group=g, async_op=True).wait()
                    else:
                        dist.all_to_all_single(recv, send, group=g)

                for _ in range(3):
                    issue(*call())
                line_up(g)
                spans = []
                for _ in range(iters):
                    F.linear(x, wgt)
                    if form.endswith("hot"):  # the GPU kept busy (and hot) as in a step
                        for _ in range(6):
                            F.linear(big_x, big_w)
                    send, recv = call()  # the copy is queued before the span, as in a step
                    sp = Span(torch.cuda.current_stream() if not rt.CPU else None)
                    sp.start()
                    issue(send, recv)
                    sp.stop()
                    spans.append(sp)
                F.linear(x, wgt)
                sync()
                med = statistics.median(sp.us() for sp in spans)
            out[form + "_us"] = rank_max(med if member else 0.0)
            out[form + "_min_rank_us"] = rank_min(med if member else 1e30)
        if member:
            line_up(g)
            b2b = back_to_back_us(lambda: dist.all_to_all_single(fixed_recv, fixed_send, group=g), iters)
        out["back_to_back_us"] = rank_max(b2b if member else 0.0)
        res["cases"].append(out)
        log(f"callforms w={w} {out['bytes']} B: back to back {out['back_to_back_us']:.1f} us; between GEMMs " +
            ", ".join(f"{f} {out[f + '_min_rank_us']:.1f}-{out[f + '_us']:.1f}"
                      for f in ("sync_fixed", "async_fixed", "sync_fresh", "async_fresh",
                                "async_fresh_hot")) + " us")


def exchange_host_path(res):
    """Rank 0 alone, exchanging over a group of one rank (as --one-rank-exchange steps do): what
    the host pays for an exchange, part by part. Each case is timed in `rounds` rounds of `calls`
    calls (CPU time of the issuing thread and wall time per call, the GPU kept ahead: a sync
    after each round only), then once call by call (wall time percentiles): the NCCL call
    async+wait on fixed buffers (`a2a`), with its receive buffer allocated as a step does
    (`a2a_alloc`), blocking (`a2a_blocking`), a Q RoPE alone (`rope`) and the RoPE followed by
    the exchange (`rope_a2a_alloc`: beside each other, does either cost more?), at a step's
    image exchange sizes of 256^2 and 512^2 (256 and 1024 tokens, 24 heads) and at 1 KiB."""
    res["world"] = rt.WORLD
    res["cases"] = []
    if rt.RANK != 0:
        return
    g = group_of(1)
    rounds, calls = 5, (100 if not rt.CPU else 10)
    for tokens in ([4, 256, 1024] if not rt.CPU else [4, 16]):
        q = torch.randn(tokens, rt.HEADS, rt.HD, device=rt.dev, dtype=rt.DT)
        rp = Rope(tokens)
        send = q.view(1, tokens, rt.HEADS, rt.HD) if tokens > 4 else torch.randn(512, device=rt.dev, dtype=rt.DT)
        recv = torch.empty_like(send)
        rope_q = lambda: rope(q, rp.cos, rp.sin)  # noqa: E731
        a2a = lambda: dist.all_to_all_single(recv, send, group=g, async_op=True).wait()  # noqa: E731
        a2a_alloc = lambda: dist.all_to_all_single(torch.empty_like(send), send, group=g,  # noqa: E731
                                                   async_op=True).wait()
        a2a_blocking = lambda: dist.all_to_all_single(recv, send, group=g)  # noqa: E731

        def rope_a2a_alloc():
            rope_q()
            a2a_alloc()

        for case, fn in (("a2a", a2a), ("a2a_alloc", a2a_alloc), ("a2a_blocking", a2a_blocking),
                         ("rope", rope_q), ("rope_a2a_alloc", rope_a2a_alloc)):
            if left() < 20:
                log("hostx: deadline at", tokens, case)
                return
            for _ in range(5):
                fn()
            sync()
            cpu, wall = [], []
            for _ in range(rounds):
                c0, t0 = time.thread_time(), time.perf_counter()
                for _ in range(calls):
                    fn()
                c1, t1 = time.thread_time(), time.perf_counter()
                sync()
                cpu.append(round((c1 - c0) * 1e6 / calls, 3))
                wall.append(round((t1 - t0) * 1e6 / calls, 3))
            each = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                each.append((time.perf_counter() - t0) * 1e6)
            sync()
            each.sort()
            pct = lambda f: round(each[min(len(each) - 1, int(f * len(each)))], 3)  # noqa: E731
            out = {"tokens": tokens, "heads": rt.HEADS if tokens > 4 else None,
                   "bytes": send.numel() * send.element_size(), "case": case, "calls": calls,
                   "cpu_us": cpu, "wall_us": wall, "call_wall_us_p10": pct(0.1),
                   "call_wall_us_p50": pct(0.5), "call_wall_us_p90": pct(0.9),
                   "call_wall_us_max": round(each[-1], 3)}
            res["cases"].append(out)
            log(f"hostx {tokens} tokens {case}: CPU {statistics.median(cpu):.1f} us, wall "
                f"{statistics.median(wall):.1f} us a call (rounds {min(wall):.1f}-{max(wall):.1f}; "
                f"call by call p50 {out['call_wall_us_p50']:.1f}, p90 {out['call_wall_us_p90']:.1f})")
