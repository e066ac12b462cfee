"""Whole steps: timed (steps_<transport>.csv), split into exchanges and the rest (breakdown), with
every kernel profiled (profile), and one GPU's step alone against every GPU at once (concurrency)."""
import statistics
import time

from ..lazy import F, dist, torch
from . import runtime as rt
from .runtime import group_of, left, line_up, log, rank_any, rank_max, rank_min, sync, worlds
from .timing import graph_time, host_time
from .flux import Model, Step, W, sdpa


def timed_steps(st, group, runs=True):
    """2 warm-up and A.steps timed calls of st, each after a barrier of `group` (None: none):
    the timed calls' seconds to finish on the device and to issue on the host. With runs
    False this rank only joins the barriers."""
    times, host = [], []
    for i in range(2 + rt.args.steps):
        sync()
        if group is not None:
            dist.barrier(group=group)
            sync()
        if not runs:
            continue
        t0 = time.perf_counter()
        st()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        if i >= 2:
            times.append(t2 - t0)
            host.append(t1 - t0)
    return times, host


def steps(rows, spans):
    """Whole steps (steps_<transport>.csv rows), and into `spans` each case's wall-clock span on
    rank 0 (Unix seconds, warm-ups included), to line up with the GPU's sampled clocks."""
    res = [int(r) for r in rt.args.resolutions.split(",")]
    for w in worlds():
        if rt.args.exchange_copy and w > 1:
            continue  # a copy stands for an exchange with no peer only
        group = group_of(w) if w > 1 or rt.args.one_rank_exchange else None
        member = rt.RANK < w
        model = Model(w, rt.RANK) if member else None
        for r in res:
            tokens = (r // 16) ** 2 if not rt.CPU else r
            for strat in (["flat"] if w == 1 and group is None else rt.args.strategies.split(",")):
                if rank_any(left() < 40):
                    log("steps: deadline at", w, r, strat)
                    return
                times, host = [], []
                ok = True
                if member:
                    try:
                        st = Step(model, tokens, strat, group, exchange=group is not None)
                        t0 = time.time()
                        times, host = timed_steps(st, group)
                        if rt.RANK == 0:
                            spans.append({"strategy": strat, "gpus": w, "resolution": r,
                                          "steps": 2 + rt.args.steps, "t0": t0, "t1": time.time()})
                        del st
                    except torch.cuda.OutOfMemoryError if not rt.CPU else MemoryError as ex:  # noqa
                        ok = False
                        log("steps: out of memory", w, r, strat, repr(ex)[:200])
                # slowest rank per step, then the median step
                ts = [rank_max(times[i] if member and ok else 0.0) for i in range(rt.args.steps)]
                hs = [rank_max(host[i] if member and ok else 0.0) for i in range(rt.args.steps)]
                if rank_any(not ok if member else False):
                    continue
                rows.append([strat, w, r, tokens, f"{statistics.median(ts) * 1e3:.3f}",
                             f"{min(ts) * 1e3:.3f}", f"{max(ts) * 1e3:.3f}",
                             f"{statistics.median(hs) * 1e3:.3f}", rt.args.transport, len(ts)])
                log(f"step {strat} w={w} res={r}: {statistics.median(ts) * 1e3:.2f} ms "
                    f"(host issue {statistics.median(hs) * 1e3:.2f} ms)")
        del model
        if not rt.CPU:
            torch.cuda.empty_cache()


def member_worlds(one=False):
    """Each world of 2 or more GPUs (and of one with `one`): (w, its group, whether this rank is
    in it, this rank's model or None). The caller drops its model at the end of each world (`del
    model`), so that it is freed and the cache emptied before the next world's model is made."""
    for w in worlds():
        if w == 1 and not one:
            continue
        member = rt.RANK < w
        model = Model(w, rt.RANK) if member else None
        yield w, group_of(w), member, model
        del model
        if not rt.CPU:
            torch.cuda.empty_cache()


def breakdown(res):
    """Flat steps on 2 and more GPUs split into their blocking exchanges (CUDA events on the
    compute stream around each all-to-all and the text all-gather, from launch to the end of the
    wait: the time the step spends in them) and the rest (compute, launches). Per timed step:
    the slowest rank's step; per rank the sum of its exchanges; medians over the timed steps.
    What a step's time is made of, to set against the emulator's own breakdown."""
    res["world"] = rt.WORLD
    res["cases"] = {}
    for w, group, member, model in member_worlds():
        for r in [int(x) for x in rt.args.resolutions.split(",")]:
            if rank_any(left() < 60):
                log("breakdown: deadline at", w, r)
                return
            tokens = (r // 16) ** 2 if not rt.CPU else r
            st = Step(model, tokens, "flat", group) if member else None
            step_s, comm_s, kinds, segs = [], [], {}, []
            for i in range(2 + rt.args.steps):
                if not member:
                    continue
                line_up(group)
                st.spans = []
                ref = None
                if not rt.CPU:  # the GPU is idle: a marker it passes at once, on the host's clock
                    ref = torch.cuda.Event(enable_timing=True)
                    ref.record()
                t0 = time.perf_counter()
                st()
                sync()
                t1 = time.perf_counter()
                if i < 2:
                    continue
                step_s.append(t1 - t0)
                by = {}
                late = 0.0  # how long the GPU reached an exchange before its host had issued it
                for kind, sp in st.spans:
                    dur = sp.us() * 1e-6
                    by[kind] = by.get(kind, 0.0) + dur
                    if ref is not None:
                        reached = ref.elapsed_time(sp.a) * 1e-3
                        late += min(max(0.0, (sp.host - t0) - reached), dur)
                comm_s.append(sum(by.values()))
                kinds.setdefault("host_late", []).append(late)
                for kind, v in by.items():
                    kinds.setdefault(kind, []).append(v)
                kinds.setdefault("calls", []).append(len(st.spans))
                # the work between consecutive exchanges, in program order
                segs.append([a.gap_us(b) * 1e-3 for (_, a), (_, b) in zip(st.spans, st.spans[1:])])
            out = {"gpus": w, "resolution": r, "image_tokens": tokens, "timed_steps": rt.args.steps}
            med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
            out["step_ms"] = statistics.median(
                [rank_max(step_s[i] if member else 0.0) for i in range(rt.args.steps)]) * 1e3
            c = med(comm_s) * 1e3
            out["exchanges_ms_max"] = rank_max(c if member else 0.0)
            out["exchanges_ms_min"] = rank_min(c if member else 1e30)
            rest = (med(step_s) - med(comm_s)) * 1e3
            out["rest_ms_max"] = rank_max(rest if member else 0.0)
            out["rest_ms_min"] = rank_min(rest if member else 1e30)
            for kind in ("to_heads", "to_tokens", "text_gather"):
                out[kind + "_ms_max"] = rank_max(med(kinds.get(kind, [])) * 1e3 if member else 0.0)
            out["calls_per_step"] = int(rank_max(med(kinds.get("calls", [])) if member else 0.0))
            # Of the exchanges' time, how much the GPU spent waiting for its own host to issue
            # them (host clock against the device's, both from the step's start)
            hl = med(kinds.get("host_late", [])) * 1e3
            out["host_late_ms_max"] = rank_max(hl if member else 0.0)
            out["host_late_ms_min"] = rank_min(hl if member else 1e30)
            out.update(segment_spread(segs if member else None, w))
            res["cases"][f"{w}x{r}"] = out
            log(f"breakdown w={w} res={r}: segments between exchanges: ranks wait "
                f"{out['segment_wait_ms']:.2f} ms a step for the slowest "
                f"({out['segment_wait_persistent_ms']:.2f} ms of it the same every step), "
                f"median spread {out['segment_cv_median']:.4f}")
            log(f"breakdown w={w} res={r}: step {out['step_ms']:.2f} ms, exchanges "
                f"{out['exchanges_ms_min']:.2f}-{out['exchanges_ms_max']:.2f} ms, rest "
                f"{out['rest_ms_min']:.2f}-{out['rest_ms_max']:.2f} ms ({out['calls_per_step']} calls); "
                f"GPU waiting for its host at them {out['host_late_ms_min']:.2f}-{out['host_late_ms_max']:.2f} ms")
            del st
        del model


def segment_spread(segs, w):
    """How far the ranks' work between two exchanges differs. segs: this rank's timed steps, each
    the list of its segments' times (ms, from the end of one exchange to the start of the next)
    or None for a rank outside the group. Per step and segment, every rank waits at the next
    exchange for the slowest rank's segment: segment_wait_ms is that wait, summed over a step's
    segments and averaged over the ranks (median over the timed steps);
    segment_wait_persistent_ms the same from each segment's median over the steps (the part of
    the spread that repeats from step to step); segment_cv_median the median over segments and
    steps of the ranks' standard deviation over their mean."""
    every = [None] * rt.WORLD
    dist.all_gather_object(every, segs, group=rt.CPU_GROUP)
    ranks = [x for x in every if x is not None][:w]
    steps_ = min(len(x) for x in ranks)
    n = min(len(x[i]) for x in ranks for i in range(steps_))

    def wait(m):  # m[rank][segment]
        per_seg = [max(col) - sum(col) / len(col) for col in zip(*[row[:n] for row in m])]
        return sum(per_seg)

    waits, cvs = [], []
    for i in range(steps_):
        m = [x[i] for x in ranks]
        waits.append(wait(m))
        for col in zip(*[row[:n] for row in m]):
            mean = sum(col) / len(col)
            if mean > 0:
                cvs.append(statistics.pstdev(col) / mean)
    med_m = [[statistics.median(x[i][j] for i in range(steps_)) for j in range(n)] for x in ranks]
    return {"segments_per_step": n, "segment_wait_ms": statistics.median(waits),
            "segment_wait_persistent_ms": wait(med_m),
            "segment_cv_median": statistics.median(cvs) if cvs else 0.0}


def kernel_kind(name):
    """A profiled device activity's kind by its name: NCCL's kernels, copies, or compute."""
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if "memcpy" in n or "memset" in n:
        return "copy"
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "cublas")):
        return "gemm"
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    return "other"


def profile(res):
    """Whole steps of every strategy with the GPU's kernels recorded (torch.profiler, CUPTI):
    per step, the device time of the compute kernels (GEMMs, attention, the rest) and of NCCL's
    kernels. Set against the same step under flat, the compute kernels' growth is what running
    beside an exchange costs them inside a real step (the model's overlap_compute_factor), and
    NCCL's kernel time how long the exchanges occupy the GPU, waits for peers included. Per rank
    the sum over the profiled steps divided by their number; the slowest and fastest rank."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as recorded
    res["world"] = rt.WORLD
    res["cases"] = {}
    kinds = ("gemm", "attention", "other", "nccl", "copy")
    for w, group, member, model in member_worlds(one=True):
        for r in [int(x) for x in rt.args.resolutions.split(",")]:
            tokens = (r // 16) ** 2 if not rt.CPU else r
            for strat in (["flat"] if w == 1 else rt.args.strategies.split(",")):
                if rank_any(left() < 50):
                    log("profile: deadline at", w, r, strat)
                    return
                by = {k: 0.0 for k in kinds}
                step_s, count = [], 0
                if member:
                    st = Step(model, tokens, strat, group)
                    for _ in range(2):
                        line_up(group)
                        st()
                    line_up(group)
                    acts = [ProfilerActivity.CPU] if rt.CPU else [ProfilerActivity.CUDA]
                    span = [time.time()]
                    with recorded(activities=acts) as prof:
                        for _ in range(rt.args.steps):
                            t0 = time.perf_counter()
                            st()
                            sync()
                            step_s.append(time.perf_counter() - t0)
                    span.append(time.time())
                    for e in prof.events():
                        on_device = str(e.device_type).endswith("CUDA")
                        if (not rt.CPU and not on_device) or (rt.CPU and e.cpu_parent is not None):
                            continue
                        by[kernel_kind(e.name)] += e.time_range.elapsed_us() * 1e-3 / rt.args.steps
                        count += 1
                    del st
                out = {"gpus": w, "resolution": r, "image_tokens": tokens, "strategy": strat,
                       "profiled_steps": rt.args.steps,
                       "step_ms": rank_max(statistics.median(step_s) * 1e3 if member else 0.0),
                       "kernels_per_step": int(rank_max(count / rt.args.steps if member else 0.0))}
                by["compute"] = by["gemm"] + by["attention"] + by["other"]
                for k, v in by.items():
                    out[k + "_ms_max"] = rank_max(v if member else 0.0)
                    out[k + "_ms_min"] = rank_min(v if member else 1e30)
                if member and rt.RANK == 0:
                    out["t0"], out["t1"] = span  # Unix seconds, rank 0: the profiler's start, after its stop
                res["cases"][f"{w}x{r}x{strat}"] = out
                log(f"profile w={w} res={r} {strat}: step {out['step_ms']:.2f} ms, compute kernels "
                    f"{out['compute_ms_min']:.2f}-{out['compute_ms_max']:.2f} ms (gemm "
                    f"{out['gemm_ms_max']:.2f}, attention {out['attention_ms_max']:.2f}, other "
                    f"{out['other_ms_max']:.2f}), nccl {out['nccl_ms_min']:.2f}-{out['nccl_ms_max']:.2f} ms")
        del model


def concurrency(res):
    """The same work on one GPU while the others idle, then on every GPU at once with no
    communication between them: whole one-GPU steps (device and host time) and single kernels
    (CUDA graph replay). What a multi-GPU step pays for sharing the host and the node with its
    peers, apart from its collectives."""
    res["world"] = rt.WORLD
    res["resolutions"] = {}
    for r in [int(x) for x in rt.args.resolutions.split(",")]:
        if rank_any(left() < 60):
            log("concurrency: deadline at", r)
            break
        tokens = (r // 16) ** 2 if not rt.CPU else r
        model = Model(1, 0)  # every rank holds the whole one-GPU model
        st = Step(model, tokens, "flat", None)
        out = {}
        for mode in ("alone", "together"):
            runs = rt.RANK == 0 or mode == "together"
            times, host = timed_steps(st, rt.CPU_GROUP, runs)
            med = statistics.median(times) * 1e3 if runs else 0.0
            hmed = statistics.median(host) * 1e3 if runs else 0.0
            out[f"step_{mode}_ms"] = rank_max(med)
            out[f"step_host_issue_{mode}_ms"] = rank_max(hmed)
        log(f"concurrency res={r}: step alone {out['step_alone_ms']:.2f} ms, together "
            f"{out['step_together_ms']:.2f} ms; host issue {out['step_host_issue_alone_ms']:.2f} / "
            f"{out['step_host_issue_together_ms']:.2f} ms")
        res["resolutions"][str(r)] = out
        del st, model
        if not rt.CPU:
            torch.cuda.empty_cache()
    n = 4096 if not rt.CPU else 64
    x = torch.randn(n, rt.HID, device=rt.dev, dtype=rt.DT)
    w1 = W(rt.MLP, rt.HID)
    q = torch.randn(1, rt.HEADS // max(rt.WORLD, 1), n + rt.TXT, rt.HD, device=rt.dev, dtype=rt.DT)
    xs = torch.randn(64, rt.HID, device=rt.dev, dtype=rt.DT)
    ws = W(rt.HID, rt.HID)
    cases = [(f"gemm_{n}x{rt.HID}x{rt.MLP}", lambda: F.linear(x, w1), "device"),
             (f"sdpa_{rt.HEADS // max(rt.WORLD, 1)}heads_{n + rt.TXT}", lambda: sdpa(q, q, q), "device"),
             ("linear_64_host", lambda: F.linear(xs, ws), "host")]
    for name, fn, kind in cases:
        for mode in ("alone", "together"):
            dist.barrier(group=rt.CPU_GROUP)
            t = 0.0
            if rt.RANK == 0 or mode == "together":
                t = graph_time(fn, 50) if kind == "device" else host_time(fn)
            res[f"{name}_{mode}_us"] = rank_max(t)
        log(f"concurrency {name}: alone {res[name + '_alone_us']:.2f} us, together "
            f"{res[name + '_together_us']:.2f} us")
