"""One rank's run of measure_multi.py: its flags, its place among the ranks, the device and the
model's dimensions, the process groups, and the helpers every part shares (the deadline, the
log, synchronisation, a value's max or min over the ranks).

setup(args) fills this module's state once per process, before any part runs (torchrun starts
one process per rank); until then every name below is None and nothing has touched torch:

    from cocodiff_fidelity.multi import runtime as rt
    rt.setup(args)          # --cpu: gloo and a tiny model on the CPU; else NCCL on LOCAL_RANK's GPU
    rt.log(rt.HID, rt.WORLD)
"""
import datetime
import os
import platform
import socket
import subprocess
import time

from ..lazy import dist, torch

args = None           # measure_multi.py's parsed flags
T0 = None             # time.time() at setup: the deadline's start
RANK = WORLD = LOCAL = None
CPU = None            # --cpu: gloo on the CPU, float32, a tiny model (a test of the code, not a measurement)
dev = DT = None       # the device tensors live on and their dtype (bf16 on a GPU)
HID = HEADS = HD = MLP = TXT = None   # FLUX.1-dev's hidden size, heads, head dim, MLP width, text tokens
DOUBLE = SINGLE = None                # its double and single blocks
TOKENS = None         # the image tokens a rank's kernels are timed at
WORLD_GROUP = None    # every rank
CPU_GROUP = None      # gloo over every rank, for the timings' max across ranks
GROUPS = {}           # ranks 0..w-1 by w (group_of)


def setup(parsed):
    """Reads the rank from torchrun's environment, picks the device and dimensions and joins the
    process group (NCCL on a GPU, gloo with --cpu)."""
    global args, T0, RANK, WORLD, LOCAL, CPU, dev, DT, HID, HEADS, HD, MLP, TXT, DOUBLE, SINGLE, TOKENS
    global WORLD_GROUP, CPU_GROUP
    args = parsed
    T0 = time.time()
    RANK = int(os.environ.get("RANK", "0"))
    WORLD = int(os.environ.get("WORLD_SIZE", "1"))
    LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
    CPU = args.cpu
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
    CPU_GROUP = dist.new_group(backend="gloo")
    GROUPS.clear()


def left():
    return args.deadline_s - (time.time() - T0)


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


def rank_any(flag):
    return rank_max(1.0 if flag else 0.0) > 0


def line_up(group):
    """Every member of `group` starts from an idle device at the same time."""
    sync()
    dist.barrier(group=group)
    sync()


def waited(work):
    if work is not None:
        work.wait()


def worlds():
    """The world sizes the parts run at: --worlds, else 1, 2, 4... up to the ranks there are."""
    if args.worlds:
        return [int(w) for w in args.worlds.split(",") if int(w) <= WORLD]
    w, out = 1, []
    while w <= WORLD:
        out.append(w)
        w *= 2
    return out


def group_of(w):
    """The process group of ranks 0..w-1 (every rank creates it; members use it)."""
    if w not in GROUPS:
        GROUPS[w] = WORLD_GROUP if w == WORLD else dist.new_group(list(range(w)))
    return GROUPS[w]


def env_info():
    """GPU, driver, CUDA, PyTorch, NCCL, host and transport (env_<transport>.json)."""
    info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": socket.gethostname(), "world": WORLD, "transport": args.transport,
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
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")][0]
    except Exception:  # noqa: BLE001
        pass
    return info
