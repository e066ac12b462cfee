#!/usr/bin/env python3
"""A rank's Q preparation whole and in head groups, measured on one H200, against what cocodiff
charges for the same ops.

For every case of configs/measurements/h200-chunks*/chunks.json (measure_multi.py --parts chunks:
W ranks' shapes at a resolution, the Q split in c head groups), runs a FLUX.1-dev step of W
ranks in the emulator (hgx-h200, flat for c = 1, else flat+pipeline with pipeline.chunks = c)
and reads, from rank 0's trace, the first double block's image Q preparation:
  send      every group's RMSNorm (q_norm, or q_norm_strided on a group's slice), RoPE (q_rope)
            and all-to-all layout (a2a_pack), against `send_us`, and each apart against
            `norm_us`, `rope_us` and `layout_us`;
  assemble  the received groups' concatenation (chunk_concat) and the text prepended (q_concat),
            against `assemble_us`.
The measurement times each op alone in a CUDA graph, with no exchange in flight, so the model runs
with the step factor and the overlap factors at 1: the tables' and the chunking's own costs.
The model also unpacks each received group (a2a_unpack), which the measured PyTorch step does not
(its receive buffer is read in place): that is printed apart, not added.

Usage: chunks_fidelity.py COCODIFF [--out DIR]
Writes DIR/chunks_fidelity.{txt,json} (default bench/fidelity/results).
"""
import json
import statistics

from cocodiff_fidelity import cli, readers, report
from cocodiff_fidelity.phantom import run_phantom_step

SETS = ["cluster.preset=hgx-h200", "cluster.device.step_factor=1", "cluster.device.overlap_compute_factor=1",
        "cluster.device.overlap_by_group.2.compute_factor=1"]


def model_prep(cocodiff, w, res, chunks, cache={}):
    """us of the first double block's image Q preparation on rank 0, by part."""
    key = (w, res, chunks)
    if key in cache:
        return cache[key]
    strategy = "flat" if chunks == 1 else "flat+pipeline"
    sets = SETS + ([f"pipeline.chunks={chunks}"] if chunks > 1 else [])
    r = run_phantom_step(cocodiff, w, res, strategy, 1, sets, trace=True)
    ev = [e for e in r["trace_events"] if e.get("ph") == "X" and e.get("cat") == "compute" and e.get("tid") == 0]
    names = [e["name"] for e in ev]
    # the image Q projection is the block's second q_proj (the text's comes first); its
    # preparation runs up to the text K projection
    start = [i for i, n in enumerate(names) if n == "q_proj"][1] + 1
    end = names.index("k_proj", start)
    out = {"norm": 0.0, "rope": 0.0, "layout": 0.0, "assemble": 0.0, "unpack": 0.0}
    for e in ev[start:end]:
        part = {"q_norm": "norm", "q_norm_strided": "norm", "q_rope": "rope", "a2a_pack": "layout"}.get(e["name"])
        if part is None:
            raise SystemExit(f"chunks_fidelity: unexpected op {e['name']} in the Q preparation of {key}")
        out[part] += e["dur"]
    attn = names.index("attention", end)
    block = ev[end:attn]
    concat = [e["dur"] for e in block if e["name"] == "chunk_concat"]
    out["assemble"] = (concat[-1] if concat else 0.0) + [e["dur"] for e in block if e["name"] == "q_concat"][0]
    # the groups of Q, K and V each unpacked: a third of them are Q's
    out["unpack"] = sum(e["dur"] for e in block if e["name"] == "a2a_unpack") / 3
    out["send"] = out["norm"] + out["rope"] + out["layout"]
    cache[key] = out
    return out


def compare(cocodiff):
    """Every measured case beside its prediction, part by part."""
    rows = []
    for path in readers.measured_files("h200-chunks*/chunks.json"):
        lease = readers.machine_of(path)
        for c in readers.read_json(path)["cases"]:
            m = model_prep(cocodiff, c["ranks"], c["resolution"], c["chunks"])
            row = {"lease": lease, "ranks": c["ranks"], "resolution": c["resolution"], "chunks": c["chunks"]}
            for part in ("send", "norm", "rope", "layout", "assemble"):
                row[part + "_us"] = c[part + "_us"]
                row[part + "_us_predicted"] = round(m[part], 3)
                row[part + "_error_pct"] = round(100 * (m[part] / c[part + "_us"] - 1), 1)
            row["unpack_us_model_only"] = round(m["unpack"], 3)
            rows.append(row)
    return rows


def table(rows):
    lines = ["# A rank's image Q preparation (configs/measurements/h200-chunks*/chunks.json) against cocodiff "
             "(hgx-h200, step and overlap factors 1), us: measured / predicted error",
             f"{'lease':<20}{'W':>2}{'res':>6}{'c':>3}" + "".join(f"{p:>20}" for p in
                                                               ("send", "norm", "rope", "layout", "assemble"))
             + f"{'unpack (model)':>16}"]
    for r in rows:
        lines.append(f"{r['lease']:<20}{r['ranks']:>2}{r['resolution']:>6}{r['chunks']:>3}"
                     + "".join(f"{r[p + '_us']:>9.1f}/{r[p + '_us_predicted']:<7.1f}{r[p + '_error_pct']:>+4.0f}%"
                               for p in ("send", "norm", "rope", "layout", "assemble"))
                     + f"{r['unpack_us_model_only']:>16.1f}")
    return lines


def summarize(rows):
    def cost_of_split(r, part):  # what splitting adds over the same case whole, measured and predicted
        whole = next(x for x in rows if x["lease"] == r["lease"] and x["ranks"] == r["ranks"]
                     and x["resolution"] == r["resolution"] and x["chunks"] == 1)
        return (r[part + "_us"] - whole[part + "_us"], r[part + "_us_predicted"] - whole[part + "_us_predicted"])

    split = [r for r in rows if r["chunks"] > 1]
    added = {p: [cost_of_split(r, p) for r in split] for p in ("send", "assemble")}
    summary = {
        "cases": len(rows),
        "send_median_abs_error_pct": statistics.median(abs(r["send_error_pct"]) for r in rows),
        "send_max_abs_error_pct": max(abs(r["send_error_pct"]) for r in rows),
        "assemble_median_abs_error_pct": statistics.median(abs(r["assemble_error_pct"]) for r in rows),
        "split_send_added_us_median_measured_predicted": [statistics.median(a for a, _ in added["send"]),
                                                          statistics.median(b for _, b in added["send"])],
        "split_assemble_added_us_median_measured_predicted": [statistics.median(a for a, _ in added["assemble"]),
                                                              statistics.median(b for _, b in added["assemble"])],
    }
    return summary


def main(argv=None):
    a = cli.analysis_parser(__doc__).parse_args(argv)
    rows = compare(a.cocodiff)
    summary = summarize(rows)
    lines = table(rows) + ["", json.dumps(summary, indent=1)]
    report.write_table(a.out, "chunks_fidelity", lines, {"rows": rows, "summary": summary, "set": SETS})


if __name__ == "__main__":
    main()
