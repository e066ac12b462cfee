"""The parts of measure_multi.py (--parts) and the files each writes into OUT (rank 0 only).

Every rank runs the same parts in the same order (each part's collectives and barriers must
meet on every rank); rank 0 writes what they measured."""
import json
import os
import time

from .. import report
from . import runtime as rt
from .collectives import collectives, graph_collectives
from .exchanges import blocking, callforms, exchange_host_path, hostbeside, interference
from .kernels import chunk_prep, host_costs, host_costs_collective, kernel_pace, kernels
from .steps import breakdown, concurrency, profile, steps
from ..lazy import dist

COLLECTIVES_HEADER = ["op", "ranks", "nodes", "bytes", "time_us", "host_us", "transport"]
KERNELS_HEADER = ["op", "label", "tokens", "heads", "k", "n", "flops", "device_us", "host_us"]
STEPS_HEADER = ["strategy", "gpus", "resolution", "image_tokens", "median_ms", "min_ms", "max_ms",
                "host_issue_ms", "transport", "timed_steps"]

# The parts that fill one JSON document, in the order they run: (part, function, file name with
# {tr} for the transport).
JSON_PARTS = [
    ("interference", interference, "interference_{tr}.json"),
    ("blocking", blocking, "blocking_{tr}.json"),
    ("hostbeside", hostbeside, "hostbeside_{tr}.json"),
    ("callforms", callforms, "callforms_{tr}.json"),
    ("breakdown", breakdown, "breakdown_{tr}.json"),
    ("profile", profile, "profile_{tr}.json"),
    ("pace", kernel_pace, "pace.json"),
    ("chunks", chunk_prep, "chunks.json"),
    ("hostx", exchange_host_path, "hostx_{tr}.json"),
    ("concurrency", concurrency, "concurrency_{tr}.json"),
]


def out_path(name):
    return os.path.join(rt.args.out, name)


def write_json(name, doc):
    with open(out_path(name), "w") as f:
        json.dump(doc, f, indent=1)


def write_csv(name, header, rows):
    report.write_csv_rows(out_path(name), header, rows)


def write_text(name, lines):
    report.write_text(out_path(name), "\n".join(lines) + "\n")


def sweeps(parts, tr):
    """collectives (eager) and graphcoll (CUDA graphs; not with --cpu): the sweeps' CSV and their
    nccl-tests text."""
    for part, run, kind in (("collectives", collectives, ""), ("graphcoll", graph_collectives, "graph_")):
        if part not in parts or (part == "graphcoll" and rt.CPU):
            continue
        rows, lines = [], []
        run(rows, lines)
        if rt.RANK == 0:
            write_csv(f"collectives_{kind}{tr}.csv", COLLECTIVES_HEADER, rows)
            write_text(f"nccl_tests_{kind}{tr}.txt", lines)


def documents(parts, tr):
    """Each JSON part that was asked for, in JSON_PARTS' order."""
    for part, run, name in JSON_PARTS:
        if part in parts:
            res = {}
            run(res)
            if rt.RANK == 0:
                write_json(name.format(tr=tr), res)


def kernel_rows(parts, tr):
    """host (eager issue costs, ops and collectives) and kernels (device times): kernels.csv, or
    host_<transport>.csv when only the host costs ran."""
    krows = []
    if "host" in parts:
        host_costs(krows)
        host_costs_collective(krows)
    if "kernels" in parts:
        kernels(krows)
    if krows and rt.RANK == 0:
        write_csv("kernels.csv" if "kernels" in parts else f"host_{tr}.csv", KERNELS_HEADER, krows)


def whole_steps(tr):
    """steps: steps<kind>_<transport>.csv and the cases' wall-clock spans."""
    rows, spans = [], []
    steps(rows, spans)
    if rt.RANK == 0:
        a = rt.args
        kind = ("1c" if a.exchange_copy else "1x") if a.one_rank_exchange else ""
        write_csv(f"steps{kind}_{tr}.csv", STEPS_HEADER, rows)
        write_json(f"steps{kind}_spans_{tr}.json", spans)


def run():
    """Every part of --parts, after rt.setup; ends the process group."""
    a = rt.args
    os.makedirs(a.out, exist_ok=True)
    tr = a.transport
    parts = a.parts.split(",")
    if rt.RANK == 0:
        e = rt.env_info()
        write_json(f"env_{tr}.json", e)
        rt.log(json.dumps({k: e.get(k) for k in ("gpu", "torch", "cuda", "nccl", "host", "world")}))
    sweeps(parts, tr)
    documents(parts, tr)
    kernel_rows(parts, tr)
    dist.barrier(group=rt.CPU_GROUP)
    if "steps" in parts:
        whole_steps(tr)
    dist.barrier(group=rt.CPU_GROUP)
    rt.log(f"done in {time.time() - rt.T0:.0f}s")
    dist.destroy_process_group()
