#!/usr/bin/env python3
"""Multi-GPU ground truth for cocodiff's collective, host/device and step models.

Run under torchrun, one process per GPU (NCCL through torch.distributed):

    torchrun --standalone --nproc_per_node=4 bench/fidelity/measure_multi.py OUT \
        --transport nvlink --parts collectives,kernels,host,interference,steps

--transport picks NCCL's transport before the communicators exist: nvlink (NCCL's default, P2P
over NVLink/NVSwitch), shm (NCCL_P2P_DISABLE=1) or socket (NCCL_P2P_DISABLE=1
NCCL_SHM_DISABLE=1); the caller sets those variables, this script records them. Writes, into
OUT (rank 0 only):

  collectives_<transport>.csv   op,ranks,nodes,bytes,time_us,host_us,transport: nccl-tests'
                                sizes (all_to_all: bytes sent per rank; all_gather: bytes
                                received; reduce_scatter: bytes sent; sendrecv: bytes sent), time
                                per call of `iters` back-to-back calls between two CUDA events,
                                slowest rank; host_us the CPU time per call to issue them
  nccl_tests_<transport>.txt    the same sweeps printed in nccl-tests' format
  kernels.csv                   op,label,tokens,heads,k,n,flops,device_us,host_us: device time of
                                every kernel sequence a FLUX.1-dev block issues (replayed in a
                                CUDA graph, so the queue never drains) and the host time to issue
                                it in eager mode (CPU time per call, GPU kept ahead)
  interference_<transport>.json a GEMM, an attention and Q/K norm+RoPE with an NCCL all-to-all in
                                flight on another stream, each alone and together
  breakdown_<transport>.json    flat steps on 2 and more GPUs split into their blocking exchanges
                                (CUDA events around each, per rank) and the rest; how far the
                                ranks' work between two exchanges differs (segment_*)
  blocking_<transport>.json     an all-to-all between two compute kernels, waited for (as a step
                                issues it), against the same call back to back, by size
  hostbeside_<transport>.json   the host's time to issue small ops while an all-to-all (or, as
                                the control, a GEMM chain) runs on another stream, and idle
  callforms_<transport>.json    a step's image all-to-all between two GEMMs in four forms
                                (blocking or async+wait; fixed buffers or a fresh copy each call)
  chunks.json                   a rank's Q preparation whole and in head groups (chunk_prep)
  pace.json                     a 4,608-token block's kernels warm (as the tables), with the L2
                                cache flushed before each call, and replayed for seconds on end
  profile_<transport>.json      whole steps of every strategy with the GPU's kernels recorded
                                (torch.profiler): device time of compute and of NCCL's kernels
                                a step, slowest and fastest rank; rank 0's wall clock at the
                                profiler's start and after its stop, its teardown included (t0, t1)
  steps_<transport>.csv         whole FLUX.1-dev steps (random bf16 weights) of flat, v_first,
                                pipeline and cocodiff (V-First + pipelining) at each resolution,
                                on 1, 2 and 4 GPUs: median of timed steps, slowest rank
  steps_spans_<transport>.json  each of those cases' wall-clock span on rank 0 (Unix seconds,
                                warm-ups included), to line up with sampled GPU clocks
  hostx_<transport>.json        rank 0 alone: the host's cost of an exchange over a group of one
                                rank, part by part (the NCCL call async+wait, with its receive
                                buffer allocated, blocking), beside a RoPE and alone; CPU time of
                                the issuing thread and wall time per call, rounds and call by call
  env_<transport>.json          GPU, driver, CUDA, PyTorch, NCCL, host, transport, date

--cpu runs the same code on CPU with gloo and a tiny model (a test of the script, not a
measurement).
"""
import argparse, csv, datetime, json, math, os, platform, socket, statistics, subprocess, sys, time

import torch
import torch.distributed as dist
import torch.nn.functional as F

P = argparse.ArgumentParser()
P.add_argument("out")
P.add_argument("--transport", default="nvlink", choices=["nvlink", "shm", "socket"])
P.add_argument("--parts", default="collectives,kernels,host,interference,steps")
P.add_argument("--worlds", default="")  # step/collective world sizes; default 1..world by 2x
P.add_argument("--resolutions", default="1024,2048")
P.add_argument("--strategies", default="flat,v_first,pipeline,cocodiff")
P.add_argument("--max-bytes", type=int, default=1 << 30)
P.add_argument("--ops", default="all_to_all,all_gather,reduce_scatter,sendrecv")
P.add_argument("--steps", type=int, default=4)  # timed steps after 2 warm-ups
P.add_argument("--deadline-s", type=float, default=540)
P.add_argument("--cpu", action="store_true")
P.add_argument("--unaligned", action="store_true")  # collectives: blocks of any whole element count
# steps: a 1-GPU step exchanges as a multi-GPU one does, over a group of one rank (the exchanges'
# host cost on one rank, no peer to wait for); its rows go to steps1x_<transport>.csv
P.add_argument("--one-rank-exchange", action="store_true")
# with --one-rank-exchange: each exchange a copy on the compute stream instead of NCCL (the
# control: the same tensors and kernels, no collective); steps1c_<transport>.csv
P.add_argument("--exchange-copy", action="store_true")
A = P.parse_args()
if A.exchange_copy and not A.one_rank_exchange:
    P.error("--exchange-copy replaces the exchanges of --one-rank-exchange steps: give both")
T0 = time.time()

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
CPU = A.cpu
if CPU:
    dev = torch.device("cpu")
    DT = torch.float32
    HID, HEADS, HD, MLP, TXT = 64, 4, 16, 128, 8
    DOUBLE, SINGLE = 2, 2
    TOKENS = [16, 32, 64]
else:
    torch.cuda.set_device(LOCAL)
    dev = torch.device("cuda", LOCAL)
    DT = torch.bfloat16
    HID, HEADS, HD, MLP, TXT = 3072, 24, 128, 12288, 512
    DOUBLE, SINGLE = 19, 38
    TOKENS = [256, 512, 1024, 2048, 4096, 8192, 16384]
    torch.backends.cuda.matmul.allow_tf32 = False
dist.init_process_group("gloo" if CPU else "nccl", **({} if CPU else {"device_id": dev}))
WORLD_GROUP = dist.group.WORLD
CPU_GROUP = dist.new_group(backend="gloo")  # for the timings' max across ranks


def left():
    return A.deadline_s - (time.time() - T0)


def log(*a):
    if RANK == 0:
        print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def sync():
    if not CPU:
        torch.cuda.synchronize()


def rank_max(x):
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=CPU_GROUP)
    return float(t.item())


def rank_min(x):
    """The smallest x over the ranks (a rank with nothing to give passes infinity)."""
    return -rank_max(-x)


def line_up(group):
    """Every member of `group` starts from an idle device at the same time."""
    sync()
    dist.barrier(group=group)
    sync()


def back_to_back_us(call, iters):
    """Device time per call of `call` issued `iters` times back to back (the sweeps' timing)."""
    sp = Span(torch.cuda.current_stream() if not CPU else None)
    sp.start()
    for _ in range(iters):
        call()
    sp.stop()
    return sp.us() / iters


def rank_any(flag):
    return rank_max(1.0 if flag else 0.0) > 0


class Span:
    """Device time between two points of a stream (CUDA events), or wall time on CPU."""

    def __init__(self, stream=None):
        self.stream = stream
        if not CPU:
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)

    def start(self):
        if CPU:
            self.t = self.t0 = time.perf_counter()
        else:
            self.a.record(self.stream)

    def stop(self):
        if CPU:
            self.t1 = time.perf_counter()
            self.t = self.t1 - self.t
        else:
            self.b.record(self.stream)

    def gap_us(self, later):
        """Time from this span's end to the start of a later span of the same stream."""
        if CPU:
            return (later.t0 - self.t1) * 1e6
        later.a.synchronize()
        return self.b.elapsed_time(later.a) * 1e3

    def us(self):
        if CPU:
            return self.t * 1e6
        self.b.synchronize()
        return self.a.elapsed_time(self.b) * 1e3


def worlds():
    if A.worlds:
        return [int(w) for w in A.worlds.split(",") if int(w) <= WORLD]
    w, out = 1, []
    while w <= WORLD:
        out.append(w)
        w *= 2
    return out


GROUPS = {}


def group_of(w):
    """The process group of ranks 0..w-1 (every rank creates it; members use it)."""
    if w not in GROUPS:
        GROUPS[w] = WORLD_GROUP if w == WORLD else dist.new_group(list(range(w)))
    return GROUPS[w]


def env_info():
    info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": socket.gethostname(), "world": WORLD, "transport": A.transport,
            "nccl_env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))},
            "torch": torch.__version__, "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    if not CPU:
        info.update({"gpu": torch.cuda.get_device_name(LOCAL),
                     "sm_count": torch.cuda.get_device_properties(LOCAL).multi_processor_count,
                     "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,memory.total,pci.bus_id",
                 "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines()
            info["topology"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True,
                                              text=True).stdout.strip().splitlines()
        except Exception as ex:  # noqa: BLE001
            info["nvidia_smi"] = f"unknown ({ex})"
    try:
        info["cpu_model"] = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                             if l.startswith("model name")][0]
    except Exception:  # noqa: BLE001
        pass
    return info


# ---------------------------------------------------------------------------------------------
# Collectives, timed as nccl-tests times them


def all_gather(out, inp, group, async_op=False):
    if not CPU:
        return dist.all_gather_into_tensor(out, inp, group=group, async_op=async_op)
    dist.all_gather(list(out.chunk(dist.get_world_size(group))), inp, group=group)  # gloo (script test)
    return None


def reduce_scatter(out, inp, group):
    if not CPU:
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
    align = w if A.unaligned else w * 64
    count = max(nbytes // el, align)
    count -= count % align
    if op == "all_gather":
        send = torch.empty(count // w, device=dev, dtype=DT)
        recv = torch.empty(count, device=dev, dtype=DT)
    elif op == "reduce_scatter":
        send = torch.empty(count, device=dev, dtype=DT)
        recv = torch.empty(count // w, device=dev, dtype=DT)
    else:
        send = torch.empty(count, device=dev, dtype=DT)
        recv = torch.empty(count, device=dev, dtype=DT)
    send.fill_(1)
    return send, recv, count * el


def time_calls(fn, iters, warm=3):
    for _ in range(warm):
        fn()
    sync()
    sp = Span()
    h0 = time.perf_counter()
    sp.start()
    for _ in range(iters):
        fn()
    h1 = time.perf_counter()
    sp.stop()
    return sp.us() / iters, (h1 - h0) * 1e6 / iters


def sweep_sizes():
    """nccl-tests' sizes: 1 KiB to --max-bytes by 2x."""
    sizes, s = [], 1024
    while s <= A.max_bytes:
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
            yield w, group_of(w), RANK < w


def collectives(rows, log_lines):
    sizes = sweep_sizes()
    for w, group, member in collective_worlds():
        for op in A.ops.split(","):
            if rank_any(left() < 10):
                log("collectives: deadline, stopping at", op, w)
                return
            lines = nccl_header(op, sizes, False) + ["# Using devices"]
            name = torch.cuda.get_device_name(LOCAL) if not CPU else "cpu"
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
                    fn = lambda: coll_call(op, w, send, recv, group, RANK)
                    one, _ = time_calls(fn, 1, warm=2)
                # every member must make the same number of calls
                iters = int(min(50, max(5, 20000.0 / max(rank_max(one if member else 0.0), 1.0))))
                if member:
                    t_us, h_us = time_calls(fn, iters)
                    del send, recv
                t_us = rank_max(t_us)
                h_us = rank_max(h_us)
                rows.append([op, w, 1, nb, f"{t_us:.3f}", f"{h_us:.3f}", A.transport])
                lines.append(nccl_row(nb, op, t_us, busf))
            lines += NCCL_FOOTER
            log_lines += lines
            log(f"collectives {op} x{w} done")


# ---------------------------------------------------------------------------------------------
# The model: FLUX.1-dev's blocks as cocodiff's FLUX model runs them (dit/models/flux.cpp,
# dit/parallel/sp_attention.cpp), in eager PyTorch


def rms(x, w):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, 1e-6)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def rope(x, cos, sin):  # diffusers apply_rotary_emb (use_real, unbind_dim=-1): x [n, h, dh]
    xr, xi = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rot = torch.stack([-xi, xr], dim=-1).flatten(-2)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def sdpa(q, k, v):  # [1, h, s, dh]
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
    return a @ v


def norm_mod(x, shift, scale):
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + scale) + shift


def gelu(x):
    return F.gelu(x, approximate="tanh")


def W(o, i):
    return (torch.randn(o, i, device=dev, dtype=DT) * (1.0 / math.sqrt(i)))


class Model:
    """Random weights of FLUX.1-dev's shape, each rank keeping what Ulysses needs on it: every
    weight, except that the replicated text stream's Q/K/V keep this rank's heads."""

    def __init__(self, w, rank):
        hl = HEADS // w
        lo, hi = rank * hl * HD, (rank + 1) * hl * HD
        self.w, self.rank, self.hl = w, rank, hl
        self.double = []
        for _ in range(DOUBLE):
            b = {"mod_img": W(6 * HID, HID), "mod_txt": W(6 * HID, HID), "out": W(HID, HID),
                 "add_out": W(HID, HID), "fc1": W(MLP, HID), "fc2": W(HID, MLP),
                 "fc1_c": W(MLP, HID), "fc2_c": W(HID, MLP)}
            for p in "qkv":
                b[p] = W(HID, HID)
                b[p + "_c"] = W(HID, HID)[lo:hi].contiguous()
            for n in ("nq", "nk", "nq_c", "nk_c"):
                b[n] = torch.ones(HD, device=dev, dtype=DT)
            self.double.append(b)
        self.single = []
        for _ in range(SINGLE):
            b = {"mod": W(3 * HID, HID), "proj_mlp": W(MLP, HID), "proj_out": W(HID, HID + MLP)}
            for p in "qkv":
                b[p] = W(HID, HID)
                b[p + "_c"] = W(HID, HID)[lo:hi].contiguous()
            for n in ("nq", "nk", "nq_c", "nk_c"):
                b[n] = torch.ones(HD, device=dev, dtype=DT)
            self.single.append(b)
        self.x_emb, self.ctx_emb = W(HID, 64), W(HID, 4096 if not CPU else 32)
        self.t1, self.t2 = W(HID, 256), W(HID, HID)
        self.norm_out, self.proj_out = W(2 * HID, HID), W(64, HID)


class Rope:
    def __init__(self, n):
        self.cos = torch.randn(n, 1, HD, device=dev, dtype=torch.float32)
        self.sin = torch.randn(n, 1, HD, device=dev, dtype=torch.float32)


class Step:
    """One denoising step of one rank: w ranks, strategy flags, `tokens` image tokens in all."""

    def __init__(self, model, tokens, strategy, group, exchange=None):
        self.m, self.n, self.group = model, tokens, group
        self.w, self.rank, self.hl = model.w, model.rank, model.hl
        self.n_loc = tokens // self.w
        # exchange: every multi-GPU step; one GPU's too with --one-rank-exchange (over `group`)
        self.exchange = self.w > 1 if exchange is None else exchange
        self.v_first = strategy in ("v_first", "cocodiff")
        self.chunks = 2 if strategy in ("pipeline", "cocodiff") and self.hl >= 2 else 1
        self.rope_img = Rope(self.n_loc)
        self.rope_txt = Rope(TXT)
        self.x = torch.randn(self.n_loc, 64, device=dev, dtype=DT)
        self.text = torch.randn(TXT, 4096 if not CPU else 32, device=dev, dtype=DT)
        self.tfreq = torch.randn(1, 256, device=dev, dtype=DT)
        self.spans = None  # a list: every blocking exchange's device time (flat), by kind

    def span_start(self):
        if self.spans is None:
            return None
        sp = Span(torch.cuda.current_stream() if not CPU else None)
        sp.start()
        return sp

    def span_issued(self, sp):
        if sp is not None:
            sp.host = time.perf_counter()  # the host has enqueued the exchange's kernel

    def span_stop(self, sp, kind):
        if sp is not None:
            sp.stop()
            self.spans.append((kind, sp))

    # Ulysses exchanges: to heads (this rank's tokens, every head -> every token, its heads)
    def a2a_async(self, send):
        recv = torch.empty_like(send)
        if A.exchange_copy:
            recv.copy_(send)
            return recv, None
        work = dist.all_to_all_single(recv, send, group=self.group, async_op=True)
        return recv, work

    def attend(self, hi, hc, b, single):
        """Q, K, V of the image stream (sharded) and text (replicated, this rank's heads), as
        sp_attention.cpp orders and overlaps them; returns the image and text outputs."""
        w, hl, n_loc = self.w, self.hl, self.n_loc
        order = "vqk" if self.v_first else "qkv"
        parts_img, parts_txt, pending = {}, {}, []
        for part in order:
            # text: this rank's heads over every text token, no exchange
            t = F.linear(hc, b[part + "_c"]).view(TXT, hl, HD)
            if part != "v":
                t = rope(rms(t, b["n" + part + "_c"]), self.rope_txt.cos, self.rope_txt.sin)
            parts_txt[part] = t
            x = F.linear(hi, b[part]).view(n_loc, w, hl, HD)
            if not self.exchange:
                if part != "v":
                    x = rope(rms(x, b["n" + part]), self.rope_img.cos.unsqueeze(1), self.rope_img.sin.unsqueeze(1))
                parts_img[part] = [x.view(n_loc, hl, HD)]
                continue
            if part == "v" or self.chunks == 1:
                if part != "v":
                    x = rope(rms(x, b["n" + part]), self.rope_img.cos.unsqueeze(1), self.rope_img.sin.unsqueeze(1))
                send = x.transpose(0, 1).contiguous()
                blocking = not self.v_first and (part == "v" or self.chunks == 1)
                sp = self.span_start() if blocking else None
                recv, work = self.a2a_async(send)
                self.span_issued(sp)
                pending.append(work)
                parts_img[part] = [recv]
                if blocking:
                    for wk in pending:
                        waited(wk)
                    pending = []
                    self.span_stop(sp, "to_heads")
                continue
            chunks = []
            for c in range(self.chunks):
                h0, h1 = hl * c // self.chunks, hl * (c + 1) // self.chunks
                xc = rope(rms(x[:, :, h0:h1], b["n" + part]), self.rope_img.cos.unsqueeze(1),
                          self.rope_img.sin.unsqueeze(1))
                recv, work = self.a2a_async(xc.transpose(0, 1).contiguous())
                pending.append(work)
                chunks.append(recv)
            parts_img[part] = chunks
        for wk in pending:
            waited(wk)
        qkv = []
        for part in "qkv":
            img = parts_img[part]
            img = img[0] if len(img) == 1 else torch.cat(img, dim=-2)  # [w, n_loc, hl, dh]
            img = img.reshape(w * n_loc, hl, HD)  # every rank's tokens (n, less n mod w)
            qkv.append(torch.cat([parts_txt[part], img], 0).transpose(0, 1).unsqueeze(0))
        o = sdpa(*qkv)[0].transpose(0, 1)  # [TXT + n, hl, dh]
        o_txt, o_img = o[:TXT].reshape(TXT, hl * HD), o[TXT:]
        if not self.exchange:
            return o_img.reshape(n_loc, HID), o_txt
        send = o_img.reshape(w, n_loc, hl * HD).contiguous()
        recv = torch.empty_like(send)
        sp = self.span_start()
        if A.exchange_copy:
            recv.copy_(send)
        else:
            dist.all_to_all_single(recv, send, group=self.group)  # back to tokens
        self.span_issued(sp)
        self.span_stop(sp, "to_tokens")
        out_img = recv.permute(1, 0, 2).reshape(n_loc, HID)
        gathered = torch.empty(w, TXT, hl * HD, device=dev, dtype=DT)
        o_txt = o_txt.contiguous().view(-1)
        sp = self.span_start()
        if A.exchange_copy:
            gathered.view(-1).copy_(o_txt)
        else:
            all_gather(gathered.view(-1), o_txt, self.group)
        self.span_issued(sp)
        self.span_stop(sp, "text_gather")
        out_txt = gathered.permute(1, 0, 2).reshape(TXT, HID)
        return out_img, out_txt

    def double_block(self, b, x, c, temb):
        mi = F.linear(temb, b["mod_img"]).chunk(6, -1)
        mt = F.linear(temb, b["mod_txt"]).chunk(6, -1)
        hi = norm_mod(x, mi[0], mi[1])
        hc = norm_mod(c, mt[0], mt[1])
        oi, ot = self.attend(hi, hc, b, False)
        x = x + mi[2] * F.linear(oi, b["out"])
        x = x + mi[5] * F.linear(gelu(F.linear(norm_mod(x, mi[3], mi[4]), b["fc1"])), b["fc2"])
        c = c + mt[2] * F.linear(ot, b["add_out"])
        c = c + mt[5] * F.linear(gelu(F.linear(norm_mod(c, mt[3], mt[4]), b["fc1_c"])), b["fc2_c"])
        return x, c

    def single_block(self, b, x, c, temb):
        m = F.linear(temb, b["mod"]).chunk(3, -1)
        hc = norm_mod(c, m[0], m[1])
        fc = gelu(F.linear(hc, b["proj_mlp"]))
        hi = norm_mod(x, m[0], m[1])
        fi = gelu(F.linear(hi, b["proj_mlp"]))
        oi, ot = self.attend(hi, hc, b, True)
        c = c + m[2] * F.linear(torch.cat([ot, fc], -1), b["proj_out"])
        x = x + m[2] * F.linear(torch.cat([oi, fi], -1), b["proj_out"])
        return x, c

    def __call__(self):
        m = self.m
        x = F.linear(self.x, m.x_emb)
        c = F.linear(self.text, m.ctx_emb)
        temb = F.silu(F.linear(F.silu(F.linear(self.tfreq, m.t1)), m.t2))
        for b in m.double:
            x, c = self.double_block(b, x, c, temb)
        for b in m.single:
            x, c = self.single_block(b, x, c, temb)
        mo = F.linear(temb, m.norm_out).chunk(2, -1)
        v = F.linear(norm_mod(x, mo[1], mo[0]), m.proj_out)
        self.x = self.x + 0.01 * v  # the sampler's Euler update
        return self.x


def timed_steps(st, group, runs=True):
    """2 warm-up and A.steps timed calls of st, each after a barrier of `group` (None: none):
    the timed calls' seconds to finish on the device and to issue on the host. With runs
    False this rank only joins the barriers."""
    times, host = [], []
    for i in range(2 + A.steps):
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
    res = [int(r) for r in A.resolutions.split(",")]
    for w in worlds():
        if A.exchange_copy and w > 1:
            continue  # a copy stands for an exchange with no peer only
        group = group_of(w) if w > 1 or A.one_rank_exchange else None
        member = RANK < w
        model = Model(w, RANK) if member else None
        for r in res:
            tokens = (r // 16) ** 2 if not CPU else r
            for strat in (["flat"] if w == 1 and group is None else A.strategies.split(",")):
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
                        if RANK == 0:
                            spans.append({"strategy": strat, "gpus": w, "resolution": r,
                                          "steps": 2 + A.steps, "t0": t0, "t1": time.time()})
                        del st
                    except torch.cuda.OutOfMemoryError if not CPU else MemoryError as ex:  # noqa
                        ok = False
                        log("steps: out of memory", w, r, strat, repr(ex)[:200])
                # slowest rank per step, then the median step
                ts = [rank_max(times[i] if member and ok else 0.0) for i in range(A.steps)]
                hs = [rank_max(host[i] if member and ok else 0.0) for i in range(A.steps)]
                if rank_any(not ok if member else False):
                    continue
                rows.append([strat, w, r, tokens, f"{statistics.median(ts) * 1e3:.3f}",
                             f"{min(ts) * 1e3:.3f}", f"{max(ts) * 1e3:.3f}",
                             f"{statistics.median(hs) * 1e3:.3f}", A.transport, len(ts)])
                log(f"step {strat} w={w} res={r}: {statistics.median(ts) * 1e3:.2f} ms "
                    f"(host issue {statistics.median(hs) * 1e3:.2f} ms)")
        del model
        if not CPU:
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Kernels: device time (CUDA graph replay: the queue never drains) and host issue time


def capture_graph(fn, reps, warm=2):
    """A CUDA graph of `reps` calls of fn, after `warm` calls on a side stream (as capture needs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return g


def graph_time(fn, reps):
    """Device time per call of fn, replayed `reps` times inside one CUDA graph."""
    if CPU:
        t, _ = time_calls(fn, reps)
        return t
    g = capture_graph(fn, reps)
    g.replay()
    sync()
    best = []
    for _ in range(3):
        sp = Span()
        sp.start()
        g.replay()
        sp.stop()
        best.append(sp.us() / reps)
    del g
    return statistics.median(best)


def host_time(fn, calls=200):
    """CPU time to issue one call of fn in eager mode, the GPU kept ahead (small shapes)."""
    for _ in range(5):
        fn()
    sync()
    c0 = time.thread_time()
    for _ in range(calls):
        fn()
    c1 = time.thread_time()
    sync()
    return (c1 - c0) * 1e6 / calls


def kernel_cases(n, h, tokens_txt=None):
    """(op, label, k, n_out, flops, fn) of the kernels a block issues for n tokens and h heads
    (labels are cocodiff's op labels, flops what cocodiff charges for them)."""
    x = torch.randn(n, HID, device=dev, dtype=DT)
    xm = torch.randn(n, MLP, device=dev, dtype=DT)
    xs = torch.randn(n, HID + MLP, device=dev, dtype=DT)
    w = {"qkv": W(HID, HID), "out": W(HID, HID), "fc1": W(MLP, HID), "fc2": W(HID, MLP),
         "po": W(HID, HID + MLP), "mod": W(6 * HID, HID)}
    q = torch.randn(n, h, HD, device=dev, dtype=DT)
    nw = torch.ones(HD, device=dev, dtype=DT)
    rp = Rope(n)
    mod = torch.randn(1, HID, device=dev, dtype=DT)
    temb = torch.randn(1, HID, device=dev, dtype=DT)
    qkv_h = W(h * HD, HID)
    lin = lambda i, o: 2.0 * n * i * o
    return [
        ("linear", "q_proj", HID, HID, lin(HID, HID), lambda: F.linear(x, w["qkv"])),
        ("linear_heads", "q_proj_heads", HID, h * HD, lin(HID, h * HD), lambda: F.linear(x, qkv_h)),
        ("linear", "attn_out", HID, HID, lin(HID, HID), lambda: F.linear(x, w["out"])),
        ("linear", "mlp_fc1", HID, MLP, lin(HID, MLP), lambda: F.linear(x, w["fc1"])),
        ("linear", "mlp_fc2", MLP, HID, lin(MLP, HID), lambda: F.linear(xm, w["fc2"])),
        ("linear", "proj_out", HID + MLP, HID, lin(HID + MLP, HID), lambda: F.linear(xs, w["po"])),
        ("rms_norm", "q_norm", HD, h, 4.0 * n * h * HD, lambda: rms(q, nw)),
        ("rope", "q_rope", HD, h, 3.0 * n * h * HD, lambda: rope(q, rp.cos, rp.sin)),
        ("norm_modulate", "norm1", HID, HID, 7.0 * n * HID, lambda: norm_mod(x, mod, mod)),
        ("gelu", "mlp_gelu", MLP, MLP, 8.0 * n * MLP, lambda: gelu(xm)),
        ("gated_residual", "residual", HID, HID, 2.0 * n * HID, lambda: x + mod * x),
        # the all-to-all's send layout for 2 peers: each peer's half of the heads made contiguous
        # (a view of one peer would be contiguous already, and .contiguous() would copy nothing)
        ("pack", "a2a_pack", HID, h, 0.0,
         lambda: q.view(n, 2, h // 2, HD).transpose(0, 1).contiguous() if h % 2 == 0 else q.clone()),
        ("unpack", "a2a_unpack", HID, h, 0.0, lambda: q.permute(1, 0, 2).contiguous()),
        ("concat", "attn_mlp_concat", HID, MLP, 0.0, lambda: torch.cat([x, xm], -1)),
        ("adaln", "adaln", HID, 6 * HID, 2.0 * 6 * HID * HID, lambda: F.linear(temb, w["mod"])),
    ]


def kernels(rows):
    if RANK != 0:
        return
    for n in TOKENS:
        if left() < 200:
            log("kernels: deadline at", n)
            break
        for h in sorted({HEADS, HEADS // 2, HEADS // 4}, reverse=True):
            if h != HEADS and n not in (512, 4096, 16384 // 4, 16384 // 2):
                continue
            for op, label, k, no, fl, fn in kernel_cases(n, h):
                if h != HEADS and op not in ("rms_norm", "rope", "linear_heads", "pack", "unpack"):
                    continue
                one, _ = time_calls(fn, 1, warm=2)
                reps = int(min(200, max(10, 20000.0 / max(one, 1.0))))
                rows.append([op, label, n, h, k, no, f"{fl:.6g}", f"{graph_time(fn, reps):.3f}", ""])
        for s in sorted({n + TXT}):
            for h in (HEADS, HEADS // 2, HEADS // 4, HEADS // 8):
                if h < 1:
                    continue
                q = torch.randn(1, h, s, HD, device=dev, dtype=DT)
                fn = lambda: sdpa(q, q, q)
                one, _ = time_calls(fn, 1, warm=2)
                reps = int(min(100, max(5, 20000.0 / max(one, 1.0))))
                rows.append(["sdpa", "attention", s, h, HD, s, f"{4.0 * h * s * s * HD:.6g}",
                             f"{graph_time(fn, reps):.3f}", ""])
        log(f"kernels n={n} done")
        if not CPU:
            torch.cuda.empty_cache()


def host_costs(rows):
    """Host time per eager op, on small shapes so the GPU never holds the host back."""
    if RANK != 0:
        return
    n = 64 if not CPU else 8
    for op, label, k, no, fl, fn in kernel_cases(n, HEADS):
        rows.append([op, label, n, HEADS, k, no, f"{fl:.6g}", "", f"{host_time(fn):.3f}"])
    q = torch.randn(1, HEADS, n, HD, device=dev, dtype=DT)
    rows.append(["sdpa", "attention", n, HEADS, HD, n, "", "", f"{host_time(lambda: sdpa(q, q, q)):.3f}"])


def waited(work):
    if work is not None:
        work.wait()


def host_costs_collective(rows):
    """Host time to issue an async all_to_all_single / all_gather (every rank issues)."""
    if WORLD < 2:
        return
    g = WORLD_GROUP
    a = torch.empty(1024 * WORLD, device=dev, dtype=DT)
    b = torch.empty_like(a)
    c = torch.empty(1024, device=dev, dtype=DT)
    for op, fn in (("all_to_all", lambda: dist.all_to_all_single(b, a, group=g, async_op=True).wait()),
                   ("all_gather", lambda: waited(all_gather(b[:1024 * WORLD], c, g, async_op=True)))):
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
        if RANK == 0:
            rows.append([op, op, 1024 * WORLD * 2, WORLD, 0, 0, "", "", f"{hu:.3f}"])


def exchange_host_path(res):
    """Rank 0 alone, exchanging over a group of one rank (as --one-rank-exchange steps do): what
    the host pays for an exchange, part by part. Each case is timed in `rounds` rounds of `calls`
    calls (CPU time of the issuing thread and wall time per call, the GPU kept ahead: a sync
    after each round only), then once call by call (wall time percentiles): the NCCL call
    async+wait on fixed buffers (`a2a`), with its receive buffer allocated as a step does
    (`a2a_alloc`), blocking (`a2a_blocking`), a Q RoPE alone (`rope`) and the RoPE followed by
    the exchange (`rope_a2a_alloc`: beside each other, does either cost more?), at a step's
    image exchange sizes of 256^2 and 512^2 (256 and 1024 tokens, 24 heads) and at 1 KiB."""
    res["world"] = WORLD
    res["cases"] = []
    if RANK != 0:
        return
    g = group_of(1)
    rounds, calls = 5, (100 if not CPU else 10)
    for tokens in ([4, 256, 1024] if not CPU else [4, 16]):
        q = torch.randn(tokens, HEADS, HD, device=dev, dtype=DT)
        rp = Rope(tokens)
        send = q.view(1, tokens, HEADS, HD) if tokens > 4 else torch.randn(512, device=dev, dtype=DT)
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
            out = {"tokens": tokens, "heads": HEADS if tokens > 4 else None,
                   "bytes": send.numel() * send.element_size(), "case": case, "calls": calls,
                   "cpu_us": cpu, "wall_us": wall, "call_wall_us_p10": pct(0.1),
                   "call_wall_us_p50": pct(0.5), "call_wall_us_p90": pct(0.9),
                   "call_wall_us_max": round(each[-1], 3)}
            res["cases"].append(out)
            log(f"hostx {tokens} tokens {case}: CPU {statistics.median(cpu):.1f} us, wall "
                f"{statistics.median(wall):.1f} us a call (rounds {min(wall):.1f}-{max(wall):.1f}; "
                f"call by call p50 {out['call_wall_us_p50']:.1f}, p90 {out['call_wall_us_p90']:.1f})")


# ---------------------------------------------------------------------------------------------
# Interference: compute beside an NCCL all-to-all in flight on another stream


def interference(res):
    if WORLD < 2:
        return
    g = WORLD_GROUP
    n = 4096 if not CPU else 64
    x = torch.randn(n, HID, device=dev, dtype=DT)
    w1 = W(MLP, HID)
    s = 16384 + TXT if not CPU else 64
    hq = torch.randn(1, HEADS // WORLD, s, HD, device=dev, dtype=DT)
    q = torch.randn(n, HEADS, HD, device=dev, dtype=DT)
    nw = torch.ones(HD, device=dev, dtype=DT)
    rp = Rope(n)
    computes = {"gemm_4096x3072x12288": lambda: F.linear(x, w1),
                "attention_sdpa": lambda: sdpa(hq, hq, hq),
                "qk_norm_rope": lambda: rope(rms(q, nw), rp.cos, rp.sin)}
    side = torch.cuda.Stream() if not CPU else None
    res["world"] = WORLD
    for mib in ((16, 256) if not CPU else (1,)):
        send = torch.empty(mib * (1 << 20) // 2, device=dev, dtype=DT)
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
                if CPU:
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


# ---------------------------------------------------------------------------------------------


def concurrency(res):
    """The same work on one GPU while the others idle, then on every GPU at once with no
    communication between them: whole one-GPU steps (device and host time) and single kernels
    (CUDA graph replay). What a multi-GPU step pays for sharing the host and the node with its
    peers, apart from its collectives."""
    res["world"] = WORLD
    res["resolutions"] = {}
    for r in [int(x) for x in A.resolutions.split(",")]:
        if rank_any(left() < 60):
            log("concurrency: deadline at", r)
            break
        tokens = (r // 16) ** 2 if not CPU else r
        model = Model(1, 0)  # every rank holds the whole one-GPU model
        st = Step(model, tokens, "flat", None)
        out = {}
        for mode in ("alone", "together"):
            runs = RANK == 0 or mode == "together"
            times, host = timed_steps(st, CPU_GROUP, runs)
            med = statistics.median(times) * 1e3 if runs else 0.0
            hmed = statistics.median(host) * 1e3 if runs else 0.0
            out[f"step_{mode}_ms"] = rank_max(med)
            out[f"step_host_issue_{mode}_ms"] = rank_max(hmed)
        log(f"concurrency res={r}: step alone {out['step_alone_ms']:.2f} ms, together "
            f"{out['step_together_ms']:.2f} ms; host issue {out['step_host_issue_alone_ms']:.2f} / "
            f"{out['step_host_issue_together_ms']:.2f} ms")
        res["resolutions"][str(r)] = out
        del st, model
        if not CPU:
            torch.cuda.empty_cache()
    n = 4096 if not CPU else 64
    x = torch.randn(n, HID, device=dev, dtype=DT)
    w1 = W(MLP, HID)
    q = torch.randn(1, HEADS // max(WORLD, 1), n + TXT, HD, device=dev, dtype=DT)
    xs = torch.randn(64, HID, device=dev, dtype=DT)
    ws = W(HID, HID)
    cases = [(f"gemm_{n}x{HID}x{MLP}", lambda: F.linear(x, w1), "device"),
             (f"sdpa_{HEADS // max(WORLD, 1)}heads_{n + TXT}", lambda: sdpa(q, q, q), "device"),
             ("linear_64_host", lambda: F.linear(xs, ws), "host")]
    for name, fn, kind in cases:
        for mode in ("alone", "together"):
            dist.barrier(group=CPU_GROUP)
            t = 0.0
            if RANK == 0 or mode == "together":
                t = graph_time(fn, 50) if kind == "device" else host_time(fn)
            res[f"{name}_{mode}_us"] = rank_max(t)
        log(f"concurrency {name}: alone {res[name + '_alone_us']:.2f} us, together "
            f"{res[name + '_together_us']:.2f} us")


def member_worlds(one=False):
    """Each world of 2 or more GPUs (and of one with `one`): (w, its group, whether this rank is
    in it, this rank's model or None). The caller drops its model at the end of each world (`del
    model`), so that it is freed and the cache emptied before the next world's model is made."""
    for w in worlds():
        if w == 1 and not one:
            continue
        member = RANK < w
        model = Model(w, RANK) if member else None
        yield w, group_of(w), member, model
        del model
        if not CPU:
            torch.cuda.empty_cache()


def breakdown(res):
    """Flat steps on 2 and more GPUs split into their blocking exchanges (CUDA events on the
    compute stream around each all-to-all and the text all-gather, from launch to the end of the
    wait: the time the step spends in them) and the rest (compute, launches). Per timed step:
    the slowest rank's step; per rank the sum of its exchanges; medians over the timed steps.
    What a step's time is made of, to set against the emulator's own breakdown."""
    res["world"] = WORLD
    res["cases"] = {}
    for w, group, member, model in member_worlds():
        for r in [int(x) for x in A.resolutions.split(",")]:
            if rank_any(left() < 60):
                log("breakdown: deadline at", w, r)
                return
            tokens = (r // 16) ** 2 if not CPU else r
            st = Step(model, tokens, "flat", group) if member else None
            step_s, comm_s, kinds, segs = [], [], {}, []
            for i in range(2 + A.steps):
                if not member:
                    continue
                line_up(group)
                st.spans = []
                ref = None
                if not CPU:  # the GPU is idle: a marker it passes at once, on the host's clock
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
            out = {"gpus": w, "resolution": r, "image_tokens": tokens, "timed_steps": A.steps}
            med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
            out["step_ms"] = statistics.median(
                [rank_max(step_s[i] if member else 0.0) for i in range(A.steps)]) * 1e3
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


def chunk_prep(res):
    """A Ulysses rank's Q preparation whole against split into head groups, as Step.attend runs
    it (device time, CUDA graph): per chunk RMSNorm and RoPE on a strided slice of the
    projection and its all-to-all layout (transpose + contiguous); on the receiving side the
    groups concatenated and the text prepended. Apart: the norms alone on the strided slices
    (norm) and on contiguous copies of them (norm_contig), the RoPEs, the layouts. Rank 0 only;
    the shapes of W ranks at each resolution (n / W image tokens a rank, 24 / W heads)."""
    if RANK != 0:
        return
    nw = torch.ones(HD, device=dev, dtype=DT)
    cases = []
    for w in (2, 3, 4):
        for res_px in [int(r) for r in A.resolutions.split(",")]:
            tokens = (res_px // 16) ** 2 if not CPU else 64
            n_loc, hl = tokens // w, HEADS // w
            for c in (1, 2, 4):
                if hl < c:
                    continue
                if left() < 20:
                    log("chunks: deadline")
                    res["cases"] = cases
                    return
                x = torch.randn(n_loc, w, hl, HD, device=dev, dtype=DT)
                rp = Rope(n_loc)
                cos, sin = rp.cos.unsqueeze(1), rp.sin.unsqueeze(1)
                bounds = [(hl * i // c, hl * (i + 1) // c) for i in range(c)]
                sl = [x[:, :, a:b] for a, b in bounds]
                normed = [rms(v, nw) for v in sl]
                roped = [rope(v, cos, sin) for v in normed]
                recv = [v.transpose(0, 1).contiguous() for v in roped]
                txt = torch.randn(TXT, hl, HD, device=dev, dtype=DT)

                def send():
                    for v in sl:
                        rope(rms(v, nw), cos, sin).transpose(0, 1).contiguous()

                def assemble():
                    img = recv[0] if c == 1 else torch.cat(recv, dim=-2)
                    torch.cat([txt, img.reshape(w * n_loc, hl, HD)], 0)

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
                if not CPU:
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
    if RANK != 0:
        return
    n = 4608 if not CPU else 64
    sustain_s = 1.5 if not CPU else 0.05
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20) if not CPU else 1 << 20
    flush_buf = torch.empty(4 * l2 // 4, device=dev, dtype=torch.float32).fill_(1.0)

    def flush():
        flush_buf.sum()

    cases = [c for c in kernel_cases(n, HEADS) if c[0] not in ("linear_heads", "pack", "unpack", "adaln")]
    q = torch.randn(1, HEADS, n, HD, device=dev, dtype=DT)
    cases.append(("sdpa", "attention", HD, n, 4.0 * HEADS * n * n * HD, lambda: sdpa(q, q, q)))
    res.update({"tokens": n, "heads": HEADS, "l2_bytes": l2, "flush_bytes": flush_buf.numel() * 4,
                "sustain_s": sustain_s, "kernels": []})
    try:
        res["sm_clock_mhz_idle"] = torch.cuda.clock_rate(dev) if not CPU else None
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
        if CPU:
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
    if not CPU:
        torch.cuda.empty_cache()


def profile(res):
    """Whole steps of every strategy with the GPU's kernels recorded (torch.profiler, CUPTI):
    per step, the device time of the compute kernels (GEMMs, attention, the rest) and of NCCL's
    kernels. Set against the same step under flat, the compute kernels' growth is what running
    beside an exchange costs them inside a real step (the model's overlap_compute_factor), and
    NCCL's kernel time how long the exchanges occupy the GPU, waits for peers included. Per rank
    the sum over the profiled steps divided by their number; the slowest and fastest rank."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as recorded
    res["world"] = WORLD
    res["cases"] = {}
    kinds = ("gemm", "attention", "other", "nccl", "copy")
    for w, group, member, model in member_worlds(one=True):
        for r in [int(x) for x in A.resolutions.split(",")]:
            tokens = (r // 16) ** 2 if not CPU else r
            for strat in (["flat"] if w == 1 else A.strategies.split(",")):
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
                    acts = [ProfilerActivity.CPU] if CPU else [ProfilerActivity.CUDA]
                    span = [time.time()]
                    with recorded(activities=acts) as prof:
                        for _ in range(A.steps):
                            t0 = time.perf_counter()
                            st()
                            sync()
                            step_s.append(time.perf_counter() - t0)
                    span.append(time.time())
                    for e in prof.events():
                        on_device = str(e.device_type).endswith("CUDA")
                        if (not CPU and not on_device) or (CPU and e.cpu_parent is not None):
                            continue
                        by[kernel_kind(e.name)] += e.time_range.elapsed_us() * 1e-3 / A.steps
                        count += 1
                    del st
                out = {"gpus": w, "resolution": r, "image_tokens": tokens, "strategy": strat,
                       "profiled_steps": A.steps,
                       "step_ms": rank_max(statistics.median(step_s) * 1e3 if member else 0.0),
                       "kernels_per_step": int(rank_max(count / A.steps if member else 0.0))}
                by["compute"] = by["gemm"] + by["attention"] + by["other"]
                for k, v in by.items():
                    out[k + "_ms_max"] = rank_max(v if member else 0.0)
                    out[k + "_ms_min"] = rank_min(v if member else 1e30)
                if member and RANK == 0:
                    out["t0"], out["t1"] = span  # Unix seconds, rank 0: the profiler's start, after its stop
                res["cases"][f"{w}x{r}x{strat}"] = out
                log(f"profile w={w} res={r} {strat}: step {out['step_ms']:.2f} ms, compute kernels "
                    f"{out['compute_ms_min']:.2f}-{out['compute_ms_max']:.2f} ms (gemm "
                    f"{out['gemm_ms_max']:.2f}, attention {out['attention_ms_max']:.2f}, other "
                    f"{out['other_ms_max']:.2f}), nccl {out['nccl_ms_min']:.2f}-{out['nccl_ms_max']:.2f} ms")
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
    every = [None] * WORLD
    dist.all_gather_object(every, segs, group=CPU_GROUP)
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


def blocking(res):
    """An all-to-all as a step issues it, between two compute kernels and waited for before the
    next one (CUDA events on the compute stream around each call), against the same call back
    to back (the sweeps' timing): what a blocking call's start-up costs that the sweeps hide,
    by size, on 2 and more GPUs."""
    res["world"] = WORLD
    res["cases"] = []
    n = 4096 if not CPU else 64
    x = torch.randn(n, HID, device=dev, dtype=DT)
    wgt = W(HID, HID)
    iters = 20 if not CPU else 3
    sizes = [1 << 20, 4 << 20, 16 << 20, 64 << 20] if not CPU else [1 << 12, 1 << 14]
    for w in worlds():
        if w == 1:
            continue
        g = group_of(w)
        member = RANK < w
        for nb in sizes:
            if rank_any(left() < 30):
                log("blocking: deadline at", w, nb)
                return
            out = {"gpus": w, "bytes": nb, "calls": iters}
            if member:
                send = torch.randn(nb // 2, device=dev, dtype=DT)
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
                    s2 = Span(torch.cuda.current_stream() if not CPU else None)
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



def hostbeside(res):
    """The host's cost to issue small eager ops (a 64-token 3072x3072 linear, about 14 us) while
    the device is busy on another stream, as in a pipelined step: every busy call (an
    all-to-all of 1 KiB, 4, 16 or 256 MiB per rank, whose shared-memory transport moves it
    through host memory; as the control, a 4096x3072x12288 GEMM) is followed by as many small
    ops as take the host about half the call's time alone, so that the busy stream never
    drains, against the same ops on an idle GPU. Per op: CPU time of the issuing thread and
    wall time (median of 5 repeats; slowest and least slowed rank); `busy_fraction` the busy
    stream's device time over the wall time of the loop (near 1: busy throughout)."""
    res["world"] = WORLD
    res["cases"] = []
    xs = torch.randn(64 if not CPU else 8, HID, device=dev, dtype=DT)
    ws = W(HID, HID)
    small = lambda: F.linear(xs, ws)  # noqa: E731
    n_ops = 200 if not CPU else 20
    big_x = torch.randn(4096 if not CPU else 64, HID, device=dev, dtype=DT)
    big_w = W(MLP, HID)
    side = torch.cuda.Stream() if not CPU else None
    sizes = [1024, 4 << 20, 16 << 20, 256 << 20] if not CPU else [1024]
    for w in worlds():
        if w == 1:
            continue
        g = group_of(w)
        member = RANK < w
        for kind, nb in [("idle", 0)] + [("all_to_all", b) for b in sizes] + [("gemm", 0)]:
            if rank_any(left() < 30):
                log("hostbeside: deadline at", w, kind, nb)
                return
            out = {"gpus": w, "busy": kind, "bytes_per_rank": nb}
            cpu, wall, frac = [], [], []
            if member:
                if kind == "all_to_all":
                    send = torch.empty(nb // 2, device=dev, dtype=DT)
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
                for rep in range(5):
                    line_up(g)
                    sp = Span(side) if work is not None else None
                    ct = wt = 0.0
                    w0 = time.perf_counter()
                    if sp is not None and not CPU:
                        sp.start()
                    for i in range(n_busy):
                        if work is not None:
                            if CPU:
                                work()
                            else:
                                with torch.cuda.stream(side):
                                    work()
                        c0, t0 = time.thread_time(), time.perf_counter()
                        for _ in range(per):
                            small()
                        ct += time.thread_time() - c0
                        wt += time.perf_counter() - t0
                    if sp is not None and not CPU:
                        sp.stop()
                    w1 = time.perf_counter()
                    sync()
                    cpu.append(ct * 1e6 / (per * n_busy))
                    wall.append(wt * 1e6 / (per * n_busy))
                    if sp is not None and not CPU:
                        frac.append(sp.us() / ((w1 - w0) * 1e6))
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
    res["world"] = WORLD
    res["cases"] = []
    n = 4096 if not CPU else 64
    x = torch.randn(n, HID, device=dev, dtype=DT)
    wgt = W(HID, HID)
    big_x = torch.randn(4 * n, HID, device=dev, dtype=DT)  # the MLP's up projection at 16k tokens
    big_w = W(MLP, HID)
    iters = 20 if not CPU else 3
    for w in worlds():
        if w == 1:
            continue
        g = group_of(w)
        member = RANK < w
        tokens = (2048 // 16) ** 2 if not CPU else 256
        n_loc, hl = tokens // w, HEADS // w
        out = {"gpus": w, "bytes": n_loc * HID * 2, "calls": iters}
        for form in ("sync_fixed", "async_fixed", "sync_fresh", "async_fresh", "async_fresh_hot"):
            if rank_any(left() < 20):
                log("callforms: deadline at", w, form)
                return
            if member:
                src = torch.randn(n_loc, w, hl, HD, device=dev, dtype=DT)
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
                    sp = Span(torch.cuda.current_stream() if not CPU else None)
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


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(header)
        wr.writerows(rows)


def graph_collectives(rows, log_lines):
    """Device time per call: `k` calls captured in one CUDA graph and replayed, so the host's
    issue cost is off the critical path and what remains is NCCL's kernels back to back (the
    latency that eager calls below a few MiB hide behind the host). sendrecv is left out."""
    sizes = sweep_sizes()
    for w, group, member in collective_worlds():
        for op in [o for o in A.ops.split(",") if o != "sendrecv"]:
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
                    fn = lambda: coll_call(op, w, send, recv, group, RANK)
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
                rows.append([op, w, 1, nb, f"{t_us:.3f}", "", A.transport + "-graph"])
                lines.append(nccl_row(nb, op, t_us, busf))
            lines += NCCL_FOOTER
            log_lines += lines
            log(f"graph collectives {op} x{w} done")


def main():
    os.makedirs(A.out, exist_ok=True)
    tr = A.transport
    parts = A.parts.split(",")
    if RANK == 0:
        e = env_info()
        json.dump(e, open(os.path.join(A.out, f"env_{tr}.json"), "w"), indent=1)
        log(json.dumps({k: e.get(k) for k in ("gpu", "torch", "cuda", "nccl", "host", "world")}))
    if "collectives" in parts:
        rows, lines = [], []
        collectives(rows, lines)
        if RANK == 0:
            write_csv(os.path.join(A.out, f"collectives_{tr}.csv"),
                      ["op", "ranks", "nodes", "bytes", "time_us", "host_us", "transport"], rows)
            open(os.path.join(A.out, f"nccl_tests_{tr}.txt"), "w").write("\n".join(lines) + "\n")
    if "graphcoll" in parts and not CPU:
        rows, lines = [], []
        graph_collectives(rows, lines)
        if RANK == 0:
            write_csv(os.path.join(A.out, f"collectives_graph_{tr}.csv"),
                      ["op", "ranks", "nodes", "bytes", "time_us", "host_us", "transport"], rows)
            open(os.path.join(A.out, f"nccl_tests_graph_{tr}.txt"), "w").write("\n".join(lines) + "\n")
    if "interference" in parts:
        res = {}
        interference(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, f"interference_{tr}.json"), "w"), indent=1)
    if "blocking" in parts:
        res = {}
        blocking(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, f"blocking_{tr}.json"), "w"), indent=1)
    if "hostbeside" in parts:
        res = {}
        hostbeside(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, f"hostbeside_{tr}.json"), "w"), indent=1)
    if "callforms" in parts:
        res = {}
        callforms(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, f"callforms_{tr}.json"), "w"), indent=1)
    if "breakdown" in parts:
        res = {}
        breakdown(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, f"breakdown_{tr}.json"), "w"), indent=1)
    if "profile" in parts:
        res = {}
        profile(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, f"profile_{tr}.json"), "w"), indent=1)
    if "pace" in parts:
        res = {}
        kernel_pace(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, "pace.json"), "w"), indent=1)
    if "chunks" in parts:
        res = {}
        chunk_prep(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, "chunks.json"), "w"), indent=1)
    if "hostx" in parts:
        res = {}
        exchange_host_path(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, f"hostx_{tr}.json"), "w"), indent=1)
    if "concurrency" in parts:
        res = {}
        concurrency(res)
        if RANK == 0:
            json.dump(res, open(os.path.join(A.out, f"concurrency_{tr}.json"), "w"), indent=1)
    krows = []
    if "host" in parts:
        host_costs(krows)
        host_costs_collective(krows)
    if "kernels" in parts:
        kernels(krows)
    if krows and RANK == 0:
        write_csv(os.path.join(A.out, "kernels.csv" if "kernels" in parts else f"host_{tr}.csv"),
                  ["op", "label", "tokens", "heads", "k", "n", "flops", "device_us", "host_us"], krows)
    dist.barrier(group=CPU_GROUP)
    if "steps" in parts:
        rows, spans = [], []
        steps(rows, spans)
        if RANK == 0:
            kind = ("1c" if A.exchange_copy else "1x") if A.one_rank_exchange else ""
            write_csv(os.path.join(A.out, f"steps{kind}_{tr}.csv"),
                      ["strategy", "gpus", "resolution", "image_tokens", "median_ms", "min_ms", "max_ms",
                       "host_issue_ms", "transport", "timed_steps"], rows)
            json.dump(spans, open(os.path.join(A.out, f"steps{kind}_spans_{tr}.json"), "w"), indent=1)
    dist.barrier(group=CPU_GROUP)
    log(f"done in {time.time() - T0:.0f}s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
