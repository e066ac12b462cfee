#!/usr/bin/env python3
"""What each family's reference implementation issues from the host per transformer block,
counted, against what it takes: host_profile.py's profile counts (host_ops.csv: top-level aten
calls per block instance) times the issue cost of each call measured alone (host_issue.csv),
against the block's host time measured without the profiler, the device kept busy
(host_blocks.csv).

The gap is the host's work that no aten call accounts for (the Python of nn.Module calls, the
attention processors, hooks, argument handling): a host model of counted calls alone misses it.
Taken as a cost per call (the framework's overhead on each call it makes), fitted to FLUX.1-dev's
blocks alone (both kinds, both batches: least squares on the measured - counted time against the
calls), it predicts every other family's blocks; the table lists both.

Usage: host_counts.py [--measured configs/measurements/h200x1-hostprofile] [--out DIR] [--reference CSV]
Writes DIR/host_counts.{txt,json} (default bench/fidelity/results), and MEASURED/reference_host.csv
(model,scope,calls,counted_us: each model's batch-1 blocks at its smallest size, derived from the
two files above), which a cluster names as device.host.reference: a block's host time is then
counted_us + calls x device.host.call_overhead_us (the per-call cost fitted here).
"""
import argparse
import csv
import json
import os
import statistics

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

# Each aten call of the profiles, by the host_issue.csv call that measures its issue cost (the
# nearest one measured where the call itself was not: a view-like op by `view`, an elementwise
# op by `mul`, a small dense op by `linear`).
CALL_COST = {
    "linear": "linear_bias", "unsqueeze": "unsqueeze_index", "add": "add", "mul": "mul",
    "to": "to_bf16", "cat": "cat_dim1", "layer_norm": "layer_norm", "silu": "silu",
    "chunk": "chunk6", "slice": "slice", "reshape": "reshape", "div": "mul",
    "scaled_dot_product_attention": "sdpa", "flatten": "flatten", "transpose": "transpose",
    "dropout": "python_noop", "gelu": "gelu_tanh", "pow": "pow", "unflatten": "reshape",
    "permute": "transpose", "view": "view", "mean": "mean", "rsqrt": "rsqrt",
    "rms_norm": "rms_norm", "neg": "neg", "stack": "stack", "unbind": "unbind",
    "contiguous": "contiguous_transposed", "split_with_sizes": "chunk6", "select": "slice",
    "type_as": "to_bf16", "view_as_complex": "view_as_complex", "view_as_real": "view_as_real",
    "arange": "add", "cos": "silu", "sin": "silu", "exp": "silu", "embedding": "linear",
    "conv2d": "linear", "einsum": "linear", "repeat_interleave": "cat_dim1", "outer": "mul",
    "reciprocal": "rsqrt",
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measured", default=os.path.join(ROOT, "configs", "measurements",
                                                       "h200x1-hostprofile"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "fidelity", "results"))
    ap.add_argument("--reference", help="where reference_host.csv goes (default: MEASURED/reference_host.csv)")
    a = ap.parse_args(argv)
    rows, unknown = counted_rows(a.measured)
    measured = os.path.relpath(a.measured, ROOT)
    lines, summary = fit_and_table(rows, unknown, measured)
    os.makedirs(a.out, exist_ok=True)
    write_reference(a.reference or os.path.join(a.measured, "reference_host.csv"), rows)
    with open(os.path.join(a.out, "host_counts.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(a.out, "host_counts.json"), "w") as f:
        json.dump({"measured": measured, "summary": summary, "rows": rows}, f, indent=1)
    print("\n".join(lines))


def counted_rows(measured_dir):
    """Per block (model, size, batch, scope): its calls, their issue costs summed and its measured
    host time; and the calls that have no measured cost."""
    issue = {r["op"]: float(r["host_us_median"])
             for r in csv.DictReader(open(os.path.join(measured_dir, "host_issue.csv")))}
    blocks = {}
    for r in csv.DictReader(open(os.path.join(measured_dir, "host_blocks.csv"))):
        blocks[(r["model"], int(r["width"]), int(r["batch"]), r["scope"])] = float(r["host_us_median"])
    counted, calls, unknown = {}, {}, set()
    for r in csv.DictReader(open(os.path.join(measured_dir, "host_ops.csv"))):
        key = (r["model"], int(r["width"]), int(r["batch"]), r["scope"])
        if r["op"] == "*total*":
            calls[key] = float(r["calls_per_instance"])
            continue
        op = r["op"].split("::", 1)[-1]
        if op not in CALL_COST:
            unknown.add(op)
            continue
        counted[key] = counted.get(key, 0.0) + float(r["calls_per_instance"]) * issue[CALL_COST[op]]
    rows = []
    for key in sorted(counted):
        if key not in blocks:
            continue
        rows.append({"model": key[0], "size": key[1], "batch": key[2], "scope": key[3],
                     "calls": calls.get(key, 0.0), "counted_us": round(counted[key], 1),
                     "measured_us": blocks[key], "ratio": round(blocks[key] / counted[key], 3)})
    return rows, unknown


def fit_and_table(rows, unknown, measured):
    """The per-call cost fitted to FLUX.1-dev's blocks, each block predicted with it (added to
    ROWS): the table's lines and the summary."""
    lines = [f"# host time per block: profile counts x issue costs measured alone ({measured}), "
             "against the block's measured host time",
             f"{'model':<12} {'size':>5} {'batch':>5} {'scope':<26} {'calls':>7} {'counted_us':>11} "
             f"{'measured_us':>12} {'ratio':>6}"]
    for r in rows:
        lines.append(f"{r['model']:<12} {r['size']:>5} {r['batch']:>5} {r['scope']:<26} "
                     f"{r['calls']:>7.1f} {r['counted_us']:>11.1f} {r['measured_us']:>12.1f} "
                     f"{r['ratio']:>6.2f}")
    # The framework's cost per call, fitted to FLUX.1-dev's blocks; every other block predicted.
    fit = [r for r in rows if r["model"] == "flux1-dev" and r["scope"] != "outside"]
    per_call = (sum((r["measured_us"] - r["counted_us"]) * r["calls"] for r in fit) /
                sum(r["calls"] ** 2 for r in fit))
    for r in rows:
        r["predicted_us"] = round(r["counted_us"] + per_call * r["calls"], 1)
        r["error_pct"] = round(100 * (r["predicted_us"] / r["measured_us"] - 1), 1)
    lines[1] += f" {'predicted_us':>12} {'error':>7}"
    for i, r in enumerate(rows):
        lines[2 + i] += f" {r['predicted_us']:>12.1f} {r['error_pct']:>6.1f}%"
    held = [abs(r["error_pct"]) for r in rows if r["model"] != "flux1-dev" and r["scope"] != "outside"]
    blk = [r["ratio"] for r in rows if r["scope"] != "outside"]
    out = [r["ratio"] for r in rows if r["scope"] == "outside"]
    summary = {"blocks_ratio_median": statistics.median(blk), "blocks_ratio_min": min(blk),
               "blocks_ratio_max": max(blk), "outside_ratio_median": statistics.median(out),
               "per_call_us_fitted_on_flux1": round(per_call, 2),
               "other_blocks_abs_error_median_pct": statistics.median(held),
               "other_blocks_abs_error_max_pct": max(held)}
    lines.append(f"# transformer blocks: measured / counted median {summary['blocks_ratio_median']:.2f} "
                 f"({summary['blocks_ratio_min']:.2f} to {summary['blocks_ratio_max']:.2f}); "
                 f"outside the blocks {summary['outside_ratio_median']:.2f}")
    lines.append(f"# with {per_call:.2f} us more a call (fitted to FLUX.1-dev's blocks): the other "
                 f"families' blocks predicted within a median {summary['other_blocks_abs_error_median_pct']:.1f}%, "
                 f"max {summary['other_blocks_abs_error_max_pct']:.1f}%")
    if unknown:
        lines.append("# calls without a cost (left out): " + ", ".join(sorted(unknown)))
    return lines, summary


def write_reference(path, rows):
    """reference_host.csv: each model's batch-1 blocks at their smallest size."""
    with open(path, "w") as f:
        f.write("model,scope,calls,counted_us\n")
        done = set()
        for r in sorted(rows, key=lambda r: (r["model"], r["scope"], r["batch"], r["size"])):
            if r["batch"] != 1 or (r["model"], r["scope"]) in done:
                continue
            done.add((r["model"], r["scope"]))
            f.write(f"{r['model']},{r['scope']},{r['calls']:.3f},{r['counted_us']:.1f}\n")


if __name__ == "__main__":
    main()
