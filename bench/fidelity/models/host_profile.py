#!/usr/bin/env python3
"""What diffusers' DiT transformers launch from the host per block, and what the host pays to issue it.

Usage: python3 bench/fidelity/models/host_profile.py OUT [--diffusers SRC_DIR] [--families a,b] [--quick]
       [--parts ops,blocks,issue] [--budget-s 300] [--plan]

Models, weights, inputs and the diffusers source tree are forwards.py's (imported, not copied): each
family's transformer built from its published config with random bf16 weights on the GPU, eval,
torch.inference_mode(), default attention dispatch, inputs shaped as the pipelines shape them.
Cases: 512^2 batch 1 and 2 (DiT-XL/2: 256^2 and 512^2, batch 1 and 2, one model per sample_size);
--quick: forwards.py's tiny configs at the family's first quick size (256^2), batch 1 and 2.
A "block" is an entry of one of the model's child nn.ModuleLists (transformer_blocks,
single_transformer_blocks); its scope is the list's name, and everything else the forward does
(embeddings, RoPE tables, norm_out, proj_out, the work between the lists) is scope "outside".
Each case runs 2 warm-up forwards, then the parts:

  ops     one forward under torch.profiler (CPU and CUDA activities, record_shapes=False), each block
          between forward pre/post hooks that open and close record_function("cocodiff_block:<list>"),
          the forward in record_function("cocodiff_window"). Top-level ops: the CPU ops ("ns::op",
          aten:: in practice) on the window's thread not nested in another op's time interval (the
          calls Python makes). Each op is in the scope whose block interval holds its start; each
          kernel launch (CPU runtime events cudaLaunchKernel*, cuLaunchKernel*,
          cudaLaunchCooperativeKernel*) in the scope and the top-level op whose intervals hold its
          start. -> OUT/host_ops.csv. Times under the profiler include its own overhead per op.
  blocks  the host's time per block instance without the profiler: the pre-hook synchronizes, queues
          torch.cuda._sleep long enough to cover the block (2x the longest instance of a probe
          forward + 300 us) and takes perf_counter; the post-hook takes perf_counter, checks that the
          sleep is still running (an event recorded after it has not completed: the host never waited
          for the device), synchronizes and queues the sleep for the next outside part. The queue so
          holds one block's launches at most and the device is busy throughout. Three forwards, the
          instances pooled; a forward in which the device caught up anywhere is run again with sleeps
          4x longer. outside = the forward's wall time less the hooks' spans. -> OUT/host_blocks.csv.
          Each timed forward is followed by an "idle" one (a synchronize before each block, no
          sleep: the device idle as the block starts), whose times go to env.json (blocks_idle_us):
          on an H200 machine a busy device made the same blocks 2-32% (mostly about 10%) dearer.
  issue   (once, before the models) the host's cost to issue one eager call: 200 calls in a loop
          behind a sleeping kernel that outlasts them (2x a probe loop + 300 us), the loop's wall
          time / 200; 5 repetitions, taken round-robin over the calls; median and min. Each call is
          also profiled 3 times to record the top-level ops and launches it makes (env.json:
          issue_ops). -> OUT/host_issue.csv
  The host's speed drifts (1.6x within a minute was seen on a shared H200 machine): env.json's
  host_reference holds the issue cost of a linear and an add at the start, before each case and
  at the end.

Writes OUT/host_ops.csv (family,model,width,height,batch,scope,instances,op,calls_per_instance,
cpu_us_median,launches_per_instance; per scope a row op="*total*": all top-level calls, the median
wall time of an instance (block: its record_function interval; outside: the window less the blocks)
and all launches, per instance), OUT/host_blocks.csv (family,model,width,height,batch,scope,
instances,host_us_median,host_us_min,host_us_max; instances per forward), OUT/host_issue.csv
(op,shape,host_us_median,host_us_min,reps; python_noop is the loop's own cost) and OUT/env.json
(versions, GPU, diffusers commit, argv, the sleep calibration, per model and case its status, the
profile's cross-checks against cpu_parent and the GPU kernel count, the sleeps, every exception).
Rows and env.json are written as they are measured; a failing family or case is recorded and the
run goes on. Families run from the smallest model to the largest; a case that would not fit in
what is left of --budget-s is skipped and listed.
"""
import argparse
import bisect
import collections
import functools
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
import forwards  # noqa: E402  (imports no torch)

ROOT = "cocodiff_window"        # record_function around the profiled forward (or issue calls)
BLOCK = "cocodiff_block:"       # + the block list's name
ISSUE = "cocodiff_issue:"       # + the issue case's label
OUTSIDE = "outside"
LAUNCH_PREFIXES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel")
PARTS = ["ops", "blocks", "issue"]
HOST_SIZES = {"dit-xl-2": [(256, 256), (512, 512)]}     # others: 512^2
BATCHES = (1, 2)
WARMUPS = 2
HOST_FORWARDS = 3               # timed (and idle) forwards per attempt of the blocks part, pooled
SLEEP_CAP_US = 200000.0
DEFAULT_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".cache",
                           "diffusers-src")


# ---- cases and estimates ---------------------------------------------------------------------------

def cases_of(name, spec, quick):
    if quick:
        sizes = spec.get("quick_sizes", forwards.QUICK_SIZES)[:1]
    else:
        sizes = HOST_SIZES.get(name, [(512, 512)])
    return [(w, h, b) for w, h in sizes for b in BATCHES]


def case_est_s(fwd_s, quick):
    """Warm-ups, the profiled forward (about 4x a plain one) and its parsing, the blocks part
    (a probe, 3 timed forwards, each block behind a sleep of 2x its host time, 3 idle ones)."""
    return WARMUPS * fwd_s + 4 * fwd_s + (0.3 if quick else 2.0) + 13 * fwd_s


def issue_est_s(quick):
    return 3.0 if quick else 10.0


def plan(fams, quick, parts):
    total = issue_est_s(quick) if "issue" in parts else 0.0
    if "issue" in parts:
        print(f"issue: {len(ISSUE_LABELS)} calls, ~{total:.0f} s")
    for name in fams if [p for p in parts if p != "issue"] else []:
        spec = dict(forwards.FAMILIES[name])
        spec["quick_mode"] = quick
        fam_s = 0.0
        for w, h, b in cases_of(name, spec, quick):
            spec["cfg"] = forwards.config_of(spec, quick, w, h)
            img = (h // 16) * (w // 16)
            t = forwards.est_forward_s(spec, spec["params"] if not quick else 1e7, b, img, spec["text"])
            c = case_est_s(t, quick)
            fam_s += c
            print(f"  {name} {w}x{h} b{b}: ~{t * 1e3:.0f} ms a forward, ~{c:.1f} s the case")
        fam_s += spec["params"] * 2 / 40e9 if not quick else 1.0
        print(f"{name}: ~{fam_s:.0f} s")
        total += fam_s
    print(f"total ~{total:.0f} s (parts: {','.join(parts)})")


# ---- profile analysis ------------------------------------------------------------------------------

def is_launch(name):
    return name.startswith(LAUNCH_PREFIXES)


def is_op(name):
    return "::" in name and not name.startswith("profiler::")


def _find(starts, items, t):
    """Index of the interval of items (sorted by start, not overlapping) that holds t, or None."""
    i = bisect.bisect_right(starts, t) - 1
    return i if i >= 0 and t <= items[i].time_range.end else None


def scopes_of(torch, events, prefix):
    """Splits a profile's events (prof.events()) into scopes: the record_function intervals named
    prefix + scope inside the one ROOT interval, and OUTSIDE (the rest of ROOT). Returns
    (scopes, checks): scopes[name] = {instances, wall_us: [per instance], calls, launches,
    ops: {op: {calls, cpu_us: [per call], launches}}}; checks: counts to compare (cpu_parent
    tree, GPU kernels, runtime calls by name)."""
    cpu_type = torch.autograd.DeviceType.CPU
    cpu = [e for e in events if e.device_type == cpu_type]
    roots = [e for e in cpu if e.name == ROOT]
    if len(roots) != 1:
        raise RuntimeError(f"profile: {len(roots)} CPU events named {ROOT}, expected 1")
    root = roots[0]
    w0, w1, thread = root.time_range.start, root.time_range.end, root.thread

    def within(e):
        return w0 <= e.time_range.start and e.time_range.end <= w1

    anns = sorted((e for e in cpu if e.thread == thread and e.name.startswith(prefix) and within(e)),
                  key=lambda e: e.time_range.start)
    ops = sorted((e for e in cpu if e.thread == thread and is_op(e.name) and within(e)),
                 key=lambda e: (e.time_range.start, -e.time_range.end))
    top, open_end = [], float("-inf")
    for e in ops:
        if e.time_range.start >= open_end:
            top.append(e)
            open_end = e.time_range.end
    launches = [e for e in cpu if is_launch(e.name) and w0 <= e.time_range.start <= w1]
    ann_starts = [a.time_range.start for a in anns]
    top_starts = [o.time_range.start for o in top]

    scopes = {}

    def scope(sname):
        return scopes.setdefault(sname, {"instances": 0, "wall_us": [], "calls": 0, "launches": 0,
                                         "launches_outside_ops": 0, "ops": {}})

    def scope_at(t):
        i = _find(ann_starts, anns, t)
        return anns[i].name[len(prefix):] if i is not None else OUTSIDE

    for a in anns:
        s = scope(a.name[len(prefix):])
        s["instances"] += 1
        s["wall_us"].append(a.time_range.end - a.time_range.start)
    out = scope(OUTSIDE)
    out["instances"] = 1
    out["wall_us"] = [(w1 - w0) - sum(a.time_range.end - a.time_range.start for a in anns)]
    top_scope = []
    for o in top:
        sname = scope_at(o.time_range.start)
        top_scope.append(sname)
        s = scope(sname)
        rec = s["ops"].setdefault(o.name, {"calls": 0, "cpu_us": [], "launches": 0})
        rec["calls"] += 1
        rec["cpu_us"].append(o.time_range.end - o.time_range.start)
        s["calls"] += 1
    by_time = {}
    for ln in launches:
        t = ln.time_range.start
        s = scope(scope_at(t))
        s["launches"] += 1
        j = _find(top_starts, top, t)
        by_time[id(ln)] = j
        if j is None:
            s["launches_outside_ops"] += 1
        else:
            scopes[top_scope[j]]["ops"][top[j].name]["launches"] += 1

    # cross-checks against the profiler's own tree (cpu_parent, built from the same intervals per
    # thread) and against the kernels the GPU ran
    top_ids = {id(o): j for j, o in enumerate(top)}
    op_ids = {id(o) for o in ops}

    def op_ancestor(e):
        p = getattr(e, "cpu_parent", None)
        while p is not None and id(p) not in op_ids:
            p = getattr(p, "cpu_parent", None)
        return p

    def top_ancestor(e):
        p = getattr(e, "cpu_parent", None)
        while p is not None and id(p) not in top_ids:
            p = getattr(p, "cpu_parent", None)
        return None if p is None else top_ids[id(p)]

    checks = {
        "events": len(events), "cpu_events": len(cpu), "ops_in_window": len(ops), "top_level_ops": len(top),
        "launches": len(launches), "window_us": w1 - w0,
        "top_level_with_op_parent": sum(1 for o in top if op_ancestor(o) is not None),
        "nested_without_op_parent": sum(1 for e in ops if id(e) not in top_ids and op_ancestor(e) is None),
        "launches_parent_differs": sum(1 for ln in launches if top_ancestor(ln) != by_time[id(ln)]),
        "launches_without_top_parent": sum(1 for ln in launches if top_ancestor(ln) is None),
        "launches_on_other_threads": sum(1 for ln in launches if ln.thread != thread),
        "gpu_kernels": sum(1 for e in events if e.device_type != cpu_type
                           and not e.name.startswith(("Memcpy", "Memset", "cocodiff"))),
        "runtime_calls": dict(collections.Counter(e.name for e in cpu if e.name.startswith("cu") and within(e))
                              .most_common(20)),
        "top_level_names_not_aten": sorted({o.name for o in top if not o.name.startswith("aten::")})[:20],
    }
    return scopes, checks


def profile_window(torch, fn):
    """Runs fn inside record_function(ROOT) under torch.profiler (CPU + CUDA); returns the events."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False,
                 profile_memory=False, with_stack=False) as prof:
        with record_function(ROOT):
            fn()
        torch.cuda.synchronize()
    return prof.events()


# ---- block hooks -----------------------------------------------------------------------------------

def block_lists(torch, model):
    """(name, nn.ModuleList) of the model's non-empty child ModuleLists: its block lists."""
    return [(n, m) for n, m in model.named_children() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]


class BlockHooks:
    """Forward pre/post hooks on every block of the block lists. mode None: nothing; "profile": each
    block in record_function(BLOCK + list); "probe": perf_counter around each block; "idle": the
    same after a synchronize (the device idle when the block starts); "timed": each block behind its
    own sleeping kernel (see the docstring at the top)."""

    def __init__(self, torch, lists):
        self.torch = torch
        self.mode = None
        self.cycles = {}        # list name -> sleep cycles before each of its blocks
        self.out_cycles = 0     # sleep cycles before each outside part
        self.handles = []
        for lname, lst in lists:
            for blk in lst:
                self.handles.append(blk.register_forward_pre_hook(functools.partial(self._pre, lname)))
                self.handles.append(blk.register_forward_hook(functools.partial(self._post, lname)))
        self.ev = torch.cuda.Event()
        self.outside_ev = torch.cuda.Event()
        self.reset()

    def reset(self):
        self.stack = []
        self.times_us = {}
        self.caught = {}
        self.outside_caught = 0
        self.hooks_s = 0.0

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def _pre(self, lname, module, args):
        if self.mode == "profile":
            rf = self.torch.profiler.record_function(BLOCK + lname)
            rf.__enter__()
            self.stack.append(rf)
        elif self.mode in ("probe", "idle", "timed"):
            t = time.perf_counter()
            if self.mode == "idle":
                self.torch.cuda.synchronize()
            elif self.mode == "timed":
                cuda = self.torch.cuda
                if self.outside_ev.query():     # the outside part before this block outlasted its sleep
                    self.outside_caught += 1
                cuda.synchronize()
                cuda._sleep(self.cycles[lname])
                self.ev.record()
            t0 = time.perf_counter()
            self.hooks_s += t0 - t
            self.stack.append(t0)

    def _post(self, lname, module, args, output):
        if self.mode == "profile":
            self.stack.pop().__exit__(None, None, None)
        elif self.mode in ("probe", "idle", "timed"):
            t1 = time.perf_counter()
            self.times_us.setdefault(lname, []).append((t1 - self.stack.pop()) * 1e6)
            if self.mode == "timed":
                cuda = self.torch.cuda
                if self.ev.query():             # the device finished the sleep before the host the block
                    self.caught[lname] = self.caught.get(lname, 0) + 1
                cuda.synchronize()
                cuda._sleep(self.out_cycles)
                self.outside_ev.record()
            self.hooks_s += time.perf_counter() - t1


def hooked_forward(torch, model, kw, hooks, mode):
    """One forward with the hooks in mode; returns (forward wall us, outside us)."""
    hooks.reset()
    hooks.mode = mode
    try:
        torch.cuda.synchronize()
        if mode == "timed":
            torch.cuda._sleep(hooks.out_cycles)
            hooks.outside_ev.record()
        t0 = time.perf_counter()
        model(**kw)
        t1 = time.perf_counter()
        if mode == "timed" and hooks.outside_ev.query():
            hooks.outside_caught += 1
        torch.cuda.synchronize()
    finally:
        hooks.mode = None
    wall_us = (t1 - t0) * 1e6
    blocks_us = sum(sum(v) for v in hooks.times_us.values())
    return wall_us, wall_us - blocks_us - hooks.hooks_s * 1e6


# ---- the parts of a case ---------------------------------------------------------------------------

def ops_part(torch, model, kw, hooks, lists, key, csv, case):
    hooks.mode = "profile"
    hooks.stack = []
    try:
        events = profile_window(torch, lambda: model(**kw))
    finally:
        hooks.mode = None
    scopes, checks = scopes_of(torch, events, BLOCK)
    del events
    case["ops_checks"] = checks
    order = [n for n, _ in lists if n in scopes] + [OUTSIDE]
    for sname in order:
        s = scopes[sname]
        n = s["instances"]
        for op, rec in sorted(s["ops"].items(), key=lambda kv: (-kv[1]["calls"], kv[0])):
            csv.row(key + [sname, n, op, rec["calls"] / n, statistics.median(rec["cpu_us"]), rec["launches"] / n])
        csv.row(key + [sname, n, "*total*", s["calls"] / n, statistics.median(s["wall_us"]), s["launches"] / n])
    case["ops_scopes"] = {sname: {"instances": scopes[sname]["instances"], "top_level_calls": scopes[sname]["calls"],
                                  "launches": scopes[sname]["launches"],
                                  "launches_outside_ops": scopes[sname]["launches_outside_ops"]} for sname in order}
    return checks


def pooled(hooks, times, outside, out_us):
    for n, v in hooks.times_us.items():
        times.setdefault(n, []).extend(v)
    outside.append(out_us)


def blocks_part(torch, model, kw, hooks, lists, key, csv, case, cycles_per_us):
    """Timed ("busy") forwards into host_blocks.csv, each followed by an "idle" one (env.json:
    blocks_idle_us), so that both see the same drift of the host's speed."""
    _, probe_out = hooked_forward(torch, model, kw, hooks, "probe")
    longest = {n: max(v) for n, v in hooks.times_us.items()}
    sleep_us = {n: min(SLEEP_CAP_US, 2.0 * v + 300.0) for n, v in longest.items()}
    out_us = min(SLEEP_CAP_US, 1.5 * max(probe_out, 0.0) + 300.0)
    case["blocks_probe"] = {"block_us_max": longest, "outside_us": probe_out}
    attempts = []
    for attempt in range(2):
        hooks.cycles = {n: int(v * cycles_per_us) for n, v in sleep_us.items()}
        hooks.out_cycles = int(out_us * cycles_per_us)
        times, outside, caught, walls = {}, [], {}, []
        idle, idle_out = {}, []
        for _ in range(HOST_FORWARDS):
            wall, out = hooked_forward(torch, model, kw, hooks, "timed")
            walls.append(wall)
            pooled(hooks, times, outside, out)
            for n, c in hooks.caught.items():
                caught[n] = caught.get(n, 0) + c
            caught[OUTSIDE] = caught.get(OUTSIDE, 0) + hooks.outside_caught
            _, out = hooked_forward(torch, model, kw, hooks, "idle")
            pooled(hooks, idle, idle_out, out)
        attempts.append({"sleep_us": dict(sleep_us), "outside_sleep_us": out_us, "forward_wall_us": walls,
                         "caught_up": caught})
        if not any(caught.values()) or attempt == 1:
            break
        sleep_us = {n: min(SLEEP_CAP_US, 4.0 * v) for n, v in sleep_us.items()}
        out_us = min(SLEEP_CAP_US, 4.0 * out_us)
    case["blocks_attempts"] = attempts
    idle[OUTSIDE] = idle_out
    case["blocks_idle_us"] = {n: {"median": statistics.median(v), "min": min(v), "max": max(v)} for n, v in idle.items()}
    for sname in [n for n, _ in lists if n in times]:
        v = sorted(times[sname])
        csv.row(key + [sname, len(v) // HOST_FORWARDS, statistics.median(v), v[0], v[-1]])
    outside.sort()
    csv.row(key + [OUTSIDE, 1, statistics.median(outside), outside[0], outside[-1]])


ISSUE_LABELS = ["python_noop", "linear", "linear_bias", "linear_mod", "layer_norm", "layer_norm_affine", "rms_norm",
                "float", "pow", "mean", "rsqrt", "mul", "add", "add_bcast", "addcmul", "silu", "gelu_tanh", "neg",
                "cat_dim1", "chunk6", "view", "reshape", "transpose", "contiguous_transposed", "unsqueeze_index",
                "slice", "sdpa", "unbind", "stack", "flatten", "view_as_complex", "view_as_real", "to_bf16"]


def issue_cases(torch, dev, quick):
    """(label, shape, fn): eager calls on bf16 CUDA tensors of a T-token x D activation
    (T 1024, D 3072, 24 heads of 128; --quick: 64 x 256, 2 heads)."""
    F = torch.nn.functional
    bf = torch.bfloat16
    t, d = (64, 256) if quick else (1024, 3072)
    hd = 128
    h = d // hd

    def r(*s, dt=bf):
        return torch.randn(*s, device=dev, dtype=dt)

    def dims(*s):
        return "x".join(str(v) for v in s)

    x, y = r(1, t, d), r(1, t, d)
    w, bias = r(d, d), r(d)
    wm, bm = r(6 * d, d), r(6 * d)
    ln_w, ln_b, nw = r(d), r(d), r(hd)
    vec, emb, mod = r(1, 1, d), r(1, d), r(1, 6 * d)
    q = r(1, h, t, hd)
    xh = x.view(1, t, h, hd)
    xt = xh.transpose(1, 2)
    xf = x.float()
    xf5 = xf.view(1, t, h, hd // 2, 2)
    cplx = torch.view_as_complex(xf5)
    pairs = r(1, h, t, hd // 2, 2)
    re, im = pairs.unbind(-1)
    act = dims(1, t, d)
    cases = [
        ("python_noop", "", lambda: None),
        ("linear", f"{act},{dims(d, d)}", lambda: F.linear(x, w)),
        ("linear_bias", f"{act},{dims(d, d)}+{d}", lambda: F.linear(x, w, bias)),
        ("linear_mod", f"{dims(1, d)},{dims(6 * d, d)}+{6 * d}", lambda: F.linear(emb, wm, bm)),
        ("layer_norm", act, lambda: F.layer_norm(x, (d,), eps=1e-6)),
        ("layer_norm_affine", act, lambda: F.layer_norm(x, (d,), ln_w, ln_b, 1e-6)),
        ("rms_norm", dims(1, t, h, hd), lambda: F.rms_norm(xh, (hd,), nw, 1e-6)),
        ("float", act, lambda: x.float()),
        ("pow", act, lambda: x.pow(2)),
        ("mean", act, lambda: x.mean(-1, keepdim=True)),
        ("rsqrt", act, lambda: torch.rsqrt(x)),
        ("mul", f"{act},{act}", lambda: x * y),
        ("add", f"{act},{act}", lambda: x + y),
        ("add_bcast", f"{act},{dims(1, 1, d)}", lambda: x + vec),
        ("addcmul", f"{act},{dims(1, 1, d)},{act}", lambda: torch.addcmul(x, vec, y)),
        ("silu", act, lambda: F.silu(x)),
        ("gelu_tanh", act, lambda: F.gelu(x, approximate="tanh")),
        ("neg", act, lambda: -x),
        ("cat_dim1", f"{act},{act}", lambda: torch.cat([x, y], dim=1)),
        ("chunk6", dims(1, 6 * d), lambda: mod.chunk(6, dim=1)),
        ("view", act, lambda: x.view(1, t, h, hd)),
        ("reshape", act, lambda: x.reshape(1, t, h, hd)),
        ("transpose", dims(1, t, h, hd), lambda: xh.transpose(1, 2)),
        ("contiguous_transposed", dims(1, h, t, hd) + " strided", lambda: xt.contiguous()),
        ("unsqueeze_index", dims(1, d), lambda: emb[:, None]),
        ("slice", act, lambda: x[..., : d // 2]),
        ("sdpa", f"3x{dims(1, h, t, hd)}", lambda: F.scaled_dot_product_attention(q, q, q)),
        ("unbind", dims(1, h, t, hd // 2, 2), lambda: pairs.unbind(-1)),
        ("stack", f"2x{dims(1, h, t, hd // 2)} strided", lambda: torch.stack([re, im], dim=-1)),
        ("flatten", dims(1, h, t, hd // 2, 2), lambda: pairs.flatten(3)),
        ("view_as_complex", dims(1, t, h, hd // 2, 2) + " fp32", lambda: torch.view_as_complex(xf5)),
        ("view_as_real", dims(1, t, h, hd // 2) + " complex64", lambda: torch.view_as_real(cplx)),
        ("to_bf16", act + " fp32", lambda: xf.to(bf)),
    ]
    assert [c[0] for c in cases] == ISSUE_LABELS
    if not hasattr(F, "rms_norm"):      # torch < 2.4
        cases = [c for c in cases if c[0] != "rms_norm"]
    return cases


def issue_loop_us(torch, fn, n, sleep_us, cycles_per_us, ev):
    """Wall time of n calls of fn queued behind a sleeping kernel, per call (us), and whether the
    device finished the sleep before the host finished the loop."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(sleep_us * cycles_per_us))
    ev.record()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    caught = bool(ev.query())
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / n, caught


def issue_part(torch, dev, quick, cycles_per_us, csv, env, envpath):
    """Every call probed (3 warm-ups, n calls without a sleep), then the repetitions round-robin over
    the calls (so that a drift of the host's speed spreads over all of them); rows at the end."""
    n, reps = (20, 2) if quick else (200, 5)
    rec = {"calls_per_loop": n, "reps": reps, "results": {}, "issue_ops": {}}
    env["issue"] = rec
    ev = torch.cuda.Event()
    with torch.inference_mode():
        cases = issue_cases(torch, dev, quick)
        live = []
        for label, shape, fn in cases:
            try:
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                probe_us = (time.perf_counter() - t0) * 1e6
                torch.cuda.synchronize()
                sleep_us = min(SLEEP_CAP_US, 2.0 * probe_us + 300.0)
                rec["results"][label] = {"probe_us_per_call": probe_us / n, "sleep_us": sleep_us, "caught_up": 0}
                live.append((label, shape, fn, sleep_us, []))
            except Exception as ex:  # noqa: BLE001
                rec["results"][label] = {"status": f"error: {ex!r}"[:600]}
                env["errors"].append(f"issue {label}: {ex!r}"[:600])
                print(f"issue {label}: failed: {ex!r}", flush=True)
        for _ in range(reps):
            for label, shape, fn, sleep_us, per in live:
                us, caught = issue_loop_us(torch, fn, n, sleep_us, cycles_per_us, ev)
                per.append(us)
                rec["results"][label]["caught_up"] += caught
        for label, shape, fn, sleep_us, per in live:
            per.sort()
            csv.row([label, shape, statistics.median(per), per[0], reps])
        try:
            def run_all():
                from torch.profiler import record_function
                for label, _, fn in cases:
                    for _ in range(3):
                        with record_function(ISSUE + label):
                            fn()
            scopes, checks = scopes_of(torch, profile_window(torch, run_all), ISSUE)
            rec["issue_ops_checks"] = checks
            for label, s in scopes.items():
                if label == OUTSIDE:
                    continue
                k = s["instances"]
                rec["issue_ops"][label] = {"top_level_ops": {op: r["calls"] / k for op, r in s["ops"].items()},
                                           "launches": s["launches"] / k}
        except Exception as ex:  # noqa: BLE001
            env["errors"].append(f"issue profile: {ex!r}"[:600])
            print(f"issue profile: failed: {ex!r}", flush=True)
    bc.write_json(envpath, env)
    print(f"issue: {len(live)} calls", flush=True)


def host_reference(torch, dev, cycles_per_us, env, budget, when):
    """The issue cost of two reference calls (linear 1024 x 3072 x 3072, add of 1024 x 3072), 200
    calls behind a sleep: appended to env.json's host_reference, to follow the host's speed over
    the run (and to normalise a case by the host's speed at its time)."""
    try:
        with torch.inference_mode():
            F = torch.nn.functional
            x = torch.randn(1, 1024, 3072, device=dev, dtype=torch.bfloat16)
            w = torch.randn(3072, 3072, device=dev, dtype=torch.bfloat16)
            ev = torch.cuda.Event()
            row = {"when": when, "at_s": round(budget.elapsed(), 1)}
            for label, fn in (("linear", lambda: F.linear(x, w)), ("add", lambda: x + x)):
                for _ in range(3):
                    fn()
                row[f"{label}_us"] = round(issue_loop_us(torch, fn, 200, 20000.0, cycles_per_us, ev)[0], 2)
        env.setdefault("host_reference", []).append(row)
    except Exception as ex:  # noqa: BLE001
        env["errors"].append(f"host reference {when}: {ex!r}"[:600])


def run_case(torch, model, lists, hooks, kw, key, parts, csvs, case, cycles_per_us):
    for _ in range(WARMUPS):
        model(**kw)
        torch.cuda.synchronize()
    for part, fn in (("ops", lambda: ops_part(torch, model, kw, hooks, lists, key, csvs["ops"], case)),
                     ("blocks", lambda: blocks_part(torch, model, kw, hooks, lists, key, csvs["blocks"], case,
                                                    cycles_per_us))):
        if part not in parts:
            continue
        try:
            fn()
            case[f"{part}_status"] = "ok"
        except Exception as ex:  # noqa: BLE001
            hooks.mode = None
            case[f"{part}_status"] = f"error: {ex!r}"[:600]
            case.setdefault("errors", []).append(f"{part}: {ex!r}"[:600])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--diffusers", default=DEFAULT_SRC, help="directory holding diffusers/ (and COMMIT); "
                    "default .cache/diffusers-src of this repository")
    ap.add_argument("--families", default=",".join(forwards.ORDER),
                    help="comma-separated: " + ",".join(forwards.ORDER))
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ",".join(PARTS))
    ap.add_argument("--quick", action="store_true", help="tiny configs (forwards.py's) at 256^2, tiny issue shapes")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--plan", action="store_true", help="print the cases and their estimated time, run nothing")
    args = ap.parse_args()
    fams = [f for f in args.families.split(",") if f]
    bad = [f for f in fams if f not in forwards.FAMILIES]
    if bad:
        sys.exit(f"host_profile: unknown families {bad}; known: {','.join(forwards.ORDER)}")
    fams = [f for f in forwards.ORDER if f in fams]
    parts = [p for p in args.parts.split(",") if p]
    if [p for p in parts if p not in PARTS]:
        sys.exit(f"host_profile: unknown parts in {parts}; known: {','.join(PARTS)}")
    if args.plan:
        plan(fams, args.quick, parts)
        return
    src = os.path.abspath(args.diffusers)
    model_parts = [p for p in parts if p != "issue"]
    if model_parts and not os.path.isdir(os.path.join(src, "diffusers")):
        sys.exit(f"host_profile: {src} holds no diffusers/ source tree")
    budget = bc.Budget(args.budget_s, [("all", 1.0)])
    import torch
    if not torch.cuda.is_available():
        sys.exit("host_profile: no CUDA device")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    timer = bc.Timer(torch, dev)        # calibrates torch.cuda._sleep: cycles per us
    env = bc.env_info(torch, dev)
    env.update({"script": "bench/fidelity/models/host_profile.py", "argv": sys.argv[1:], "budget_s": args.budget_s,
                "quick": args.quick, "parts": parts,
                "sleep_cycles_per_us": timer.cycles_per_us, "warmups": WARMUPS, "host_forwards": HOST_FORWARDS,
                "launch_prefixes": list(LAUNCH_PREFIXES), "models": [], "cases": [], "errors": []})
    if model_parts:
        forwards.diffusers_env(src, env)
    else:
        env["diffusers_src"] = src
    envpath = os.path.join(args.out, "env.json")
    bc.write_json(envpath, env)
    print({k: env.get(k) for k in ("gpu", "driver", "torch", "cuda", "diffusers_version", "diffusers_commit")},
          flush=True)
    key_cols = ["family", "model", "width", "height", "batch", "scope", "instances"]
    csvs = {}
    if "ops" in parts:
        csvs["ops"] = bc.CsvOut(os.path.join(args.out, "host_ops.csv"),
                                key_cols + ["op", "calls_per_instance", "cpu_us_median", "launches_per_instance"])
    if "blocks" in parts:
        csvs["blocks"] = bc.CsvOut(os.path.join(args.out, "host_blocks.csv"),
                                   key_cols + ["host_us_median", "host_us_min", "host_us_max"])
    if "issue" in parts:
        csvs["issue"] = bc.CsvOut(os.path.join(args.out, "host_issue.csv"),
                                  ["op", "shape", "host_us_median", "host_us_min", "reps"])
    try:    # the profiler's first session in a process initialises CUPTI: not in a measured one
        profile_window(torch, lambda: torch.ones(8, device=dev) + 1)
    except Exception as ex:  # noqa: BLE001
        env["errors"].append(f"profiler warm-up: {ex!r}"[:600])
    host_reference(torch, dev, timer.cycles_per_us, env, budget, "start")
    if "issue" in parts:
        try:
            issue_part(torch, dev, args.quick, timer.cycles_per_us, csvs["issue"], env, envpath)
        except Exception as ex:  # noqa: BLE001
            env["errors"].append(f"issue: {ex!r}"[:600])
            print(f"issue: failed: {ex!r}", flush=True)
        print(f"issue done at {budget.elapsed():.0f}s", flush=True)
    for name in fams if model_parts else []:
        spec = dict(forwards.FAMILIES[name])
        spec["quick_mode"] = args.quick
        groups = {}   # one model per distinct config (DiT: one per sample_size)
        for w, h, b in cases_of(name, spec, args.quick):
            cfg = forwards.config_of(spec, args.quick, w, h)
            groups.setdefault(repr(sorted(cfg.items())), (cfg, []))[1].append((w, h, b))
        for cfg, cases in groups.values():
            spec["cfg"] = cfg
            rec = {"model": name, "class": spec["cls"], "config": cfg}
            env["models"].append(rec)
            params = spec["params"] if not args.quick else 1e7
            first = case_est_s(forwards.est_forward_s(spec, params, cases[0][2], (cases[0][1] // 16) *
                                                      (cases[0][0] // 16), spec["text"]), args.quick)
            build_est = 5.0 + spec["params"] * 2 / 40e9 if not args.quick else 5.0
            if budget.left() < build_est + first:
                rec["status"] = f"skipped: budget ({budget.left():.0f} s left)"
                for w, h, b in cases:
                    env["cases"].append({"model": name, "width": w, "height": h, "batch": b,
                                         "status": "skipped: budget before building the model"})
                print(f"{name}: skipped, {budget.left():.0f} s left", flush=True)
                bc.write_json(envpath, env)
                continue
            model, hooks = None, None
            try:
                klass, how = forwards.import_class(src, spec["module"], spec["cls"])
                rec["import"] = how
                t0 = time.time()
                model, other = forwards.build(torch, klass, cfg)
                torch.cuda.synchronize()
                rec["build_s"] = round(time.time() - t0, 2)
                rec["cast_to_bf16_from"] = other
                rec["params"] = sum(p.numel() for p in model.parameters())
                lists = block_lists(torch, model)
                rec["block_lists"] = {n: len(m) for n, m in lists}
                hooks = BlockHooks(torch, lists)
                rec["status"] = "built"
                print(f"{name}: {spec['cls']} built in {rec['build_s']} s, {rec['params'] / 1e9:.2f} B params, "
                      f"blocks {rec['block_lists']}, at {budget.elapsed():.0f}s", flush=True)
            except Exception as ex:  # noqa: BLE001
                rec["status"] = f"error: {ex!r}"[:600]
                env["errors"].append(f"{name} build: {ex!r}"[:600])
                print(f"{name}: build failed: {ex!r}", flush=True)
                for w, h, b in cases:
                    env["cases"].append({"model": name, "width": w, "height": h, "batch": b,
                                         "status": "error: the model was not built"})
                model = hooks = lists = None
                gc.collect()
                torch.cuda.empty_cache()
                bc.write_json(envpath, env)
                continue
            for w, h, b in cases:
                case = {"model": name, "width": w, "height": h, "batch": b}
                env["cases"].append(case)
                est = case_est_s(forwards.est_forward_s(spec, rec["params"], b, (h // 16) * (w // 16), spec["text"]),
                                 args.quick)
                if budget.left() < est + 5.0:
                    case["status"] = f"skipped: budget ({budget.left():.0f} s left, ~{est:.1f} s the case)"
                    print(f"{name} {w}x{h} b{b}: {case['status']}", flush=True)
                    continue
                host_reference(torch, dev, timer.cycles_per_us, env, budget, f"{name} {w}x{h} b{b}")
                t0 = time.time()
                try:
                    with torch.inference_mode():
                        kw, _ = forwards.make_inputs(torch, name, spec, b, w, h, dev)
                        run_case(torch, model, lists, hooks, kw, [spec["family"], name, w, h, b], parts, csvs, case,
                                 timer.cycles_per_us)
                    kw = None
                    bad_parts = [p for p in model_parts if case.get(f"{p}_status") != "ok"]
                    case["status"] = "ok" if not bad_parts else f"error in {','.join(bad_parts)}"
                    for e in case.get("errors", []):
                        env["errors"].append(f"{name} {w}x{h} b{b} {e}"[:600])
                except Exception as ex:  # noqa: BLE001
                    case["status"] = f"error: {ex!r}"[:600]
                    env["errors"].append(f"{name} {w}x{h} b{b}: {ex!r}"[:600])
                    kw = None
                    gc.collect()
                    torch.cuda.empty_cache()
                case["wall_s"] = round(time.time() - t0, 2)
                print(f"{name} {w}x{h} b{b}: {case['status']} in {case['wall_s']} s at {budget.elapsed():.0f}s",
                      flush=True)
                bc.write_json(envpath, env)
            hooks.remove()
            # `lists` holds the blocks too: dropped with the model, or the next family is built
            # beside this one's weights (FLUX.2-dev's 60 GiB after Qwen-Image's ran out of memory).
            model = hooks = lists = None
            gc.collect()
            torch.cuda.empty_cache()
            bc.write_json(envpath, env)
    for c in csvs.values():
        c.close()
    host_reference(torch, dev, timer.cycles_per_us, env, budget, "end")
    bc.finish_env(envpath, env, budget, "host_profile")


if __name__ == "__main__":
    main()
