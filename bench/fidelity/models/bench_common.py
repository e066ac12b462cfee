"""Timing, environment and CSV helpers shared by microbench.py and forwards.py (bench/fidelity/models).

Device time is taken with CUDA events around each call. Small calls are timed behind a
sleeping kernel (torch.cuda._sleep) that holds the stream while the host queues every timed
repetition, so an event pair brackets the kernels alone and not the host's launch gaps. The L2
cache is not flushed between repetitions: every repetition reuses the same tensors, so operands
that fit in L2 (50 MB on H100/H200) may be read from it.
"""
import csv
import datetime
import json
import os
import platform
import shutil
import subprocess
import time


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def smi_query(fields):
    """One nvidia-smi --query-gpu line for GPU 0 (of CUDA_VISIBLE_DEVICES), or None."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "-i", "0", f"--query-gpu={fields}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip() if r.returncode == 0 else f"error: {r.stderr.strip()[:200]}"
    except Exception as ex:  # noqa: BLE001
        return f"error: {ex!r}"


CLOCK_FIELDS = "clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu"


def env_info(torch, device):
    info = {"date_utc": utc_now(), "host": platform.node(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None), "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update({"gpu": torch.cuda.get_device_name(device), "sm_count": p.multi_processor_count,
                     "gpu_memory_bytes": p.total_memory,
                     "capability": f"{p.major}.{p.minor}",
                     "cudnn": torch.backends.cudnn.version(),
                     "bf16_reduced_precision_reduction":
                         torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction})
        info["driver"] = smi_query("driver_version,name,memory.total,power.limit")
        info["clocks_before"] = smi_query(CLOCK_FIELDS)
        info["clocks_fields"] = CLOCK_FIELDS
        info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return info


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def finish_env(envpath, env, budget, what):
    """The clocks after, the wall time and whether the budget left cases out, into env.json; and
    a last line naming the cases that ran."""
    env["clocks_after"] = smi_query(CLOCK_FIELDS)
    env["wall_s"] = round(budget.elapsed(), 1)
    env["budget_reached"] = any(str(c.get("status", "")).startswith("skipped") for c in env["cases"])
    write_json(envpath, env)
    n_ok = sum(1 for c in env["cases"] if c.get("status") == "ok")
    print(f"{what} done in {budget.elapsed():.0f}s: {n_ok}/{len(env['cases'])} cases ok, "
          f"{len(env['errors'])} errors", flush=True)


class CsvOut:
    """A CSV file written row by row (flushed), so a run stopped midway keeps what it measured."""

    def __init__(self, path, columns):
        self.path = path
        self.columns = columns
        self.f = open(path, "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(columns)
        self.f.flush()
        self.rows = 0

    def row(self, values):
        assert len(values) == len(self.columns), (values, self.columns)
        self.w.writerow([f"{v:.3f}" if isinstance(v, float) else v for v in values])
        self.f.flush()
        self.rows += 1

    def close(self):
        self.f.close()


class Timer:
    """Median, min and max device time of a callable, in microseconds."""

    def __init__(self, torch, device, target_s=0.02, min_reps=3, max_reps=50, max_queue=600):
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.target_s = target_s
        self.min_reps = min_reps
        self.max_reps = max_reps
        self.max_queue = max_queue  # launches queued behind the sleep kernel at most
        self.cycles_per_us = None
        if self.cuda:
            self._calibrate_sleep()

    def _calibrate_sleep(self):
        torch = self.torch
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        best = None
        for _ in range(3):
            s.record()
            torch.cuda._sleep(2_000_000)
            e.record()
            e.synchronize()
            us = s.elapsed_time(e) * 1e3
            best = us if best is None else min(best, us)
        self.cycles_per_us = 2_000_000 / max(best, 1.0)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, fn, kernels=1):
        """Returns (median_us, min_us, max_us, reps). kernels: launches per call (bounds the queue)."""
        if not self.cuda:
            return self._time_cpu(fn)
        torch = self.torch
        fn()  # first warm-up: allocations, cuBLAS heuristics, lazy modules
        torch.cuda.synchronize()
        h0 = time.perf_counter()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        host_us = (time.perf_counter() - h0) * 1e6
        e.synchronize()
        one_us = max(s.elapsed_time(e) * 1e3, 1.0)
        if one_us < 20000:
            fn()  # second warm-up for all but the longest calls
        reps = int(min(self.max_reps, max(self.min_reps, self.target_s * 1e6 / one_us)))
        reps = max(self.min_reps, min(reps, self.max_queue // (kernels + 2)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        torch.cuda.synchronize()
        if one_us < 4 * host_us:
            # the host would not keep ahead of the device: hold the stream while it queues them all
            sleep_us = min(60000.0, reps * (host_us + 10.0) * 1.5 + 100.0)
            torch.cuda._sleep(int(sleep_us * self.cycles_per_us))
        for i in range(reps):
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        t = sorted(a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends))
        return t[len(t) // 2], t[0], t[-1], reps

    def _time_cpu(self, fn):
        fn()
        t = []
        for _ in range(self.min_reps):
            t0 = time.perf_counter()
            fn()
            t.append((time.perf_counter() - t0) * 1e6)
        t.sort()
        return t[len(t) // 2], t[0], t[-1], len(t)


class Budget:
    """Wall-clock budget split into sections by cumulative fractions; time a section leaves unused
    carries over to the next."""

    def __init__(self, total_s, fractions):
        self.t0 = time.time()
        self.total = total_s
        self.ends = {}
        acc = 0.0
        for name, frac in fractions:
            acc += frac
            self.ends[name] = total_s * acc

    def elapsed(self):
        return time.time() - self.t0

    def left(self, section=None):
        end = self.total if section is None else self.ends[section]
        return end - self.elapsed()
