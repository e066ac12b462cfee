"""Collectives timed as nccl-tests times them (collectives_<transport>.csv and nccl_tests_*.txt):
eager calls back to back (device and host time), and calls captured in a CUDA graph (device time
alone)."""
import os
import socket

from ..lazy import dist, torch
from . import runtime as rt
from .runtime import group_of, left, log, rank_any, rank_max, sync, worlds
from .timing import Span, time_calls


def all_gather(out, inp, group, async_op=False):
    if not rt.CPU:
        return dist.all_gather_into_tensor(out, inp, group=group, async_op=async_op)
    dist.all_gather(list(out.chunk(dist.get_world_size(group))), inp, group=group)  # gloo (script test)
    return None


def reduce_scatter(out, inp, group):
    if not rt.CPU:
        return dist.reduce_scatter_tensor(out, inp, group=group)
    t = inp.clone()  # gloo has no reduce-scatter (script test only)
    dist.all_reduce(t, group=group)
    out.copy_(t.chunk(dist.get_world_size(group))[dist.get_rank(group)])
    return None


def coll_call(op, w, send, recv, group, rank):
    if op == "all_to_all":
        dist.all_to_all_single(recv, send, group=group)
    elif op == "all_gather":
        all_gather(recv, send, group)
    elif op == "reduce_scatter":
        reduce_scatter(recv, send, group)
    elif op == "sendrecv":  # ring: send to rank+1, receive from rank-1 (nccl-tests' sendrecv)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % w, group),
               dist.P2POp(dist.irecv, recv, (rank - 1) % w, group)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()


def coll_buffers(op, w, nbytes):
    """nccl-tests' size: all_to_all and reduce_scatter the send buffer, all_gather the receive
    buffer, sendrecv the bytes sent."""
    el = 2  # bf16 (float on CPU is timed with the same element count)
    # Every rank's block a whole number of 128-byte lines, as a DiT's blocks are (tokens x heads x
    # head_dim): NCCL copies a block that does not start on a 16-byte boundary several times
    # slower (configs/measurements/h100x4-threes/). Powers of two keep nccl-tests' sizes.
    align = w if rt.args.unaligned else w * 64
    count = max(nbytes // el, align)
    count -= count % align
    if op == "all_gather":
        send = torch.empty(count // w, device=rt.dev, dtype=rt.DT)
        recv = torch.empty(count, device=rt.dev, dtype=rt.DT)
    elif op == "reduce_scatter":
        send = torch.empty(count, device=rt.dev, dtype=rt.DT)
        recv = torch.empty(count // w, device=rt.dev, dtype=rt.DT)
    else:
        send = torch.empty(count, device=rt.dev, dtype=rt.DT)
        recv = torch.empty(count, device=rt.dev, dtype=rt.DT)
    send.fill_(1)
    return send, recv, count * el


def sweep_sizes():
    """nccl-tests' sizes: 1 KiB to --max-bytes by 2x."""
    sizes, s = [], 1024
    while s <= rt.args.max_bytes:
        sizes.append(s)
        s *= 2
    return sizes


def nccl_header(op, sizes, graph):
    return [f"# Collective test starting: {op.replace('_', '')}_perf",
            f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: 2(factor) "
            f"warmup iters: 3 iters: adaptive agg iters: 1 validation: 0 graph: {1 if graph else 0}", "#"]


def nccl_row(nb, op, t_us, busf):
    """One row as nccl-tests prints it (in-place: N/A, torch.distributed has none)."""
    algbw = nb / t_us / 1e3
    return (f"{nb:12d} {nb // 2:13d}  bfloat16    {'sum' if op == 'reduce_scatter' else 'none':>4s}"
            f"      -1 {t_us:8.2f} {algbw:7.2f} {algbw * busf:7.2f}      0      N/A     N/A"
            f"     N/A    N/A")


NCCL_FOOTER = ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : n/a", "#", ""]


def collective_worlds():
    """(ranks, their group, whether this rank is one of them) for every world of 2 or more."""
    for w in worlds():
        if w >= 2:
            yield w, group_of(w), rt.RANK < w


def collectives(rows, log_lines):
    sizes = sweep_sizes()
    for w, group, member in collective_worlds():
        for op in rt.args.ops.split(","):
            if rank_any(left() < 10):
                log("collectives: deadline, stopping at", op, w)
                return
            lines = nccl_header(op, sizes, False) + ["# Using devices"]
            name = torch.cuda.get_device_name(rt.LOCAL) if not rt.CPU else "cpu"
            host = socket.gethostname()
            for r in range(w):
                lines.append(f"#  Rank {r:2d} Group  0 Pid {os.getpid():6d} on {host:>10s} device {r:2d} "
                             f"[0x{r:02x}] {name}")
            lines += ["#", "#                                                              "
                      "out-of-place                       in-place",
                      "#       size         count      type   redop    root     time   algbw   busbw "
                      "#wrong     time   algbw   busbw #wrong",
                      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
                      "          (us)  (GB/s)  (GB/s)"]
            busf = {"all_to_all": (w - 1) / w, "all_gather": (w - 1) / w,
                    "reduce_scatter": (w - 1) / w, "sendrecv": 1.0}[op]
            for nbytes in sizes:
                t_us = h_us = 0.0
                nb = nbytes
                if member:
                    send, recv, nb = coll_buffers(op, w, nbytes)
                    fn = lambda: coll_call(op, w, send, recv, group, rt.RANK)
                    one, _ = time_calls(fn, 1, warm=2)
                # every member must make the same number of calls
                iters = int(min(50, max(5, 20000.0 / max(rank_max(one if member else 0.0), 1.0))))
                if member:
                    t_us, h_us = time_calls(fn, iters)
                    del send, recv
                t_us = rank_max(t_us)
                h_us = rank_max(h_us)
                rows.append([op, w, 1, nb, f"{t_us:.3f}", f"{h_us:.3f}", rt.args.transport])
                lines.append(nccl_row(nb, op, t_us, busf))
            lines += NCCL_FOOTER
            log_lines += lines
            log(f"collectives {op} x{w} done")


def graph_collectives(rows, log_lines):
    """Device time per call: `k` calls captured in one CUDA graph and replayed, so the host's
    issue cost is off the critical path and what remains is NCCL's kernels back to back (the
    latency that eager calls below a few MiB hide behind the host). sendrecv is left out."""
    sizes = sweep_sizes()
    for w, group, member in collective_worlds():
        for op in [o for o in rt.args.ops.split(",") if o != "sendrecv"]:
            lines = nccl_header(op, sizes, True)
            busf = (w - 1) / w
            for nbytes in sizes:
                if rank_any(left() < 15):
                    log("graph collectives: deadline, stopping at", op, w, nbytes)
                    log_lines += lines
                    return
                t_us = 0.0
                nb = nbytes
                one = 0.0
                if member:
                    send, recv, nb = coll_buffers(op, w, nbytes)
                    fn = lambda: coll_call(op, w, send, recv, group, rt.RANK)
                    one, _ = time_calls(fn, 1, warm=2)
                # calls per graph: about 10 ms of eager time, the same on every member
                k = int(min(64, max(2, 10000.0 / max(rank_max(one), 1.0))))
                if member:
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        fn()
                    torch.cuda.current_stream().wait_stream(side)
                    sync()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        for _ in range(k):
                            fn()
                    g.replay()
                    sync()
                    reps = 3
                    sp = Span()
                    sp.start()
                    for _ in range(reps):
                        g.replay()
                    sp.stop()
                    t_us = sp.us() / (reps * k)
                    del g, send, recv
                t_us = rank_max(t_us)
                rows.append([op, w, 1, nb, f"{t_us:.3f}", "", rt.args.transport + "-graph"])
                lines.append(nccl_row(nb, op, t_us, busf))
            lines += NCCL_FOOTER
            log_lines += lines
            log(f"graph collectives {op} x{w} done")
