"""Device time and host time as every part takes them: CUDA events on a stream (wall time on the
CPU), calls back to back, a CUDA graph's replays, the issuing thread's CPU time."""
import statistics
import time

from ..lazy import torch
from . import runtime as rt
from .runtime import sync


class Span:
    """Device time between two points of a stream (CUDA events), or wall time on CPU."""

    def __init__(self, stream=None):
        self.stream = stream
        if not rt.CPU:
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)

    def start(self):
        if rt.CPU:
            self.t = self.t0 = time.perf_counter()
        else:
            self.a.record(self.stream)

    def stop(self):
        if rt.CPU:
            self.t1 = time.perf_counter()
            self.t = self.t1 - self.t
        else:
            self.b.record(self.stream)

    def gap_us(self, later):
        """Time from this span's end to the start of a later span of the same stream."""
        if rt.CPU:
            return (later.t0 - self.t1) * 1e6
        later.a.synchronize()
        return self.b.elapsed_time(later.a) * 1e3

    def us(self):
        if rt.CPU:
            return self.t * 1e6
        self.b.synchronize()
        return self.a.elapsed_time(self.b) * 1e3


def back_to_back_us(call, iters):
    """Device time per call of `call` issued `iters` times back to back (the sweeps' timing)."""
    sp = Span(torch.cuda.current_stream() if not rt.CPU else None)
    sp.start()
    for _ in range(iters):
        call()
    sp.stop()
    return sp.us() / iters


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
    if rt.CPU:
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
