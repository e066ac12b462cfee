#!/usr/bin/env python3
"""Why a step's kernels take longer than the kernel tables time them: the pace measurements
against the tables, and the profiled 1-GPU steps by kind of kernel against cocodiff's.

Reads configs/measurements/h200x1-pace*/ (gpu_suite.sh pace: pace.json, smi_samples.csv,
steps_nvlink.csv) and h200x1-profile/profile_nvlink.json, and prints:
  kernels   each kernel of a 4,608-token block (a 1-GPU 1024^2 step's shapes, and a 4-GPU
            2048^2 rank's projections) timed as the tables are (warm), with the L2 cache flushed
            before each call (cold), in its first replay and after 1.5 s of replays on end
            (sustained); the GPU's SM clock, power and the share of samples power-capped (the
            driver's SW power cap reason) over the sustained phase's last second;
  steps     the same GPU while the flat 1-GPU steps ran (every sample above 400 W after the
            kernels, that is the steps' window);
  by kind   the 1-GPU steps' compute kernels, profiled, by kind (GEMMs, attention, the rest)
            against the kernel tables' times of the same ops (cocodiff's hgx-h200 step with
            device.step_factor = 1, summed by op label), and against the preset's factor; from
            h200x1-profile/ and the profiles of h200x1-clocks*/, with the GPU's SM clock over
            the profiled steps where it was sampled;
  clocks    the flat 1-GPU steps at 512^2-2048^2 of h200x1-clocks*/ (gpu_suite.sh clocks: 32
            steps each, the clocks sampled throughout), measured against cocodiff's hgx-h200
            prediction, with the GPU's SM clock, power and power-capped share over the last two
            thirds of each resolution's timed steps (steps_spans_nvlink.json).

Usage: pace_fidelity.py COCODIFF [--out DIR]
Writes DIR/pace_fidelity.{txt,json} (default bench/fidelity/results).
"""
import csv, datetime, glob, json, os, statistics, tomllib

from cocodiff_fidelity import cli, paths, readers, report
from cocodiff_fidelity.phantom import run_phantom_step

M = paths.MEASUREMENTS
POWER_CAP = 0x4  # nvidia-smi clocks_event_reasons: SW power cap
# cocodiff's FLUX.1-dev op labels that are GEMMs (dit/layers.cpp charges them as OpKind::kGemm)
GEMMS = {"adaln", "attn_add_out", "attn_out", "context_embedder", "embed_fc1", "embed_fc2", "k_proj",
         "mlp_fc1", "mlp_fc2", "proj_mlp", "proj_out", "q_proj", "v_proj", "x_embedder"}


def samples(directory):
    """(unix time, SM MHz, power W, reasons) of smi_samples.csv (nvidia-smi's local time is UTC
    on the measured machines: smi_clock.txt holds both clocks at the sampler's start)."""
    out = []
    with open(os.path.join(directory, "smi_samples.csv"), newline="") as f:
        lines = list(csv.reader(f))[1:]
    for r in lines:
        try:
            t = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
            out.append((t.replace(tzinfo=datetime.timezone.utc).timestamp(), int(r[1]), float(r[3]),
                        int(r[5], 16) if len(r) > 5 else 0))
        except (ValueError, IndexError):
            continue  # a line nvidia-smi cut short
    return out


def gpu_state(window):
    if not window:
        return {"sm_mhz": None, "power_w": None, "capped": None}
    return {"sm_mhz": statistics.median(s[1] for s in window),
            "power_w": round(statistics.median(s[2] for s in window), 1),
            "capped": round(sum(bool(s[3] & POWER_CAP) for s in window) / len(window), 2)}


def model_by_kind(cocodiff, res):
    """The kernel tables' time of a 1-GPU flat step by kind (ms): cocodiff's hgx-h200 step with
    the step factor at 1, its trace summed by op label."""
    r = run_phantom_step(cocodiff, 1, res, "flat", 1,
                         ["cluster.preset=hgx-h200", "cluster.device.step_factor=1"], trace=True)
    kinds = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for e in r["trace_events"]:
        if e.get("ph") == "X" and e.get("cat") == "compute" and e.get("tid") == 0:
            n = e["name"]
            kinds["attention" if n == "attention" else "gemm" if n in GEMMS else "other"] += e["dur"] / 1e3
    return kinds


def preset_step_factor():
    with open(paths.cluster("hgx-h200"), "rb") as f:
        return tomllib.load(f).get("device", {}).get("step_factor", 1.0)


def pace_kernels(lines):
    """The kernels timed warm, cold and sustained, and the GPU during the 1-GPU steps after them."""
    kernels, steps = [], []
    dirs = sorted(glob.glob(os.path.join(M, "h200x1-pace*")))
    lines.append("# Kernels of a 4,608-token block on one H200 (configs/measurements/h200x1-pace*/pace.json), us a call")
    lines.append(f"{'lease':<14}{'kernel':<17}{'warm':>8}{'cold':>8}{'c/w':>7}{'first':>9}{'sustained':>10}"
                 f"{'s/f':>7}{'SM MHz':>8}{'W':>6}{'capped':>7}")
    for d in dirs:
        lease = os.path.basename(d)
        smi = samples(d)
        pace = readers.read_json(os.path.join(d, "pace.json"))
        for k in pace["kernels"]:
            st = gpu_state([s for s in smi if k["t1"] - 1.0 <= s[0] <= k["t1"]])
            row = {"lease": lease, "label": k["label"], "op": k["op"], "warm_us": k["warm_us"],
                   "cold_us": k["cold_us"], "first_us": k["first_replay_us"],
                   "sustained_us": k["sustained_us"], "cold_over_warm": round(k["cold_us"] / k["warm_us"], 3),
                   "sustained_over_first": round(k["sustained_us"] / k["first_replay_us"], 3), **st}
            kernels.append(row)
            lines.append(f"{lease:<14}{k['label']:<17}{k['warm_us']:>8.1f}{k['cold_us']:>8.1f}"
                         f"{row['cold_over_warm']:>7.3f}{k['first_replay_us']:>9.1f}{k['sustained_us']:>10.1f}"
                         f"{row['sustained_over_first']:>7.3f}{st['sm_mhz'] or 0:>8.0f}{st['power_w'] or 0:>6.0f}"
                         f"{st['capped'] or 0:>7.2f}")
        end = pace["kernels"][-1]["t1"] if pace["kernels"] else 0
        window = [s for s in smi if s[0] > end + 0.5 and s[2] > 400]
        measured = {int(r["resolution"]): float(r["median_ms"])
                    for r in readers.read_csv(os.path.join(d, "steps_nvlink.csv"))}
        steps.append({"lease": lease, "steps_ms": measured, "samples": len(window), **gpu_state(window)})
    lines += ["", "# The GPU while the flat 1-GPU steps ran (samples above 400 W after the kernels)",
              f"{'lease':<14}{'steps (ms)':<28}{'samples':>8}{'SM MHz':>8}{'W':>6}{'capped':>7}"]
    for s in steps:
        ms = ", ".join(f"{r}^2 {v:.1f}" for r, v in sorted(s["steps_ms"].items()))
        lines.append(f"{s['lease']:<14}{ms:<28}{s['samples']:>8}{s['sm_mhz'] or 0:>8.0f}{s['power_w'] or 0:>6.0f}"
                     f"{s['capped'] or 0:>7.2f}")
    return kernels, steps


def profiled_by_kind(cocodiff, lines, factor):
    """The profiled 1-GPU steps' kernels by kind against the tables'."""
    by_kind, tables_by_res = [], {}
    lines += ["", f"# The profiled 1-GPU flat steps by kind, ms a step: in the step / the kernel"
              f" tables' (hgx-h200, step factor 1) = ratio; the preset's device.step_factor is {factor};"
              " the GPU's median SM clock over the profiled steps where sampled",
              f"{'lease':<16}{'res':>6}" + "".join(f"{k:>26}" for k in ("gemm", "attention", "other", "all compute"))
              + f"{'SM MHz':>8}"]
    leases = [os.path.join(M, "h200x1-profile")] + sorted(glob.glob(os.path.join(M, "h200x1-clocks*")))
    for d in leases:
        lease = os.path.basename(d)
        smi = samples(d) if os.path.exists(os.path.join(d, "smi_samples.csv")) else []
        profile = readers.read_json(os.path.join(d, "profile_nvlink.json"))["cases"]
        for c in sorted(profile.values(), key=lambda c: c["resolution"]):
            res = c["resolution"]
            if res not in tables_by_res:
                tables_by_res[res] = model_by_kind(cocodiff, res)
                tables_by_res[res]["all compute"] = sum(tables_by_res[res].values())
            tables = tables_by_res[res]
            step = {"gemm": c["gemm_ms_max"], "attention": c["attention_ms_max"], "other": c["other_ms_max"]}
            step["all compute"] = sum(step.values())
            # the profiled steps alone: from their start, as many step times as were profiled
            st = gpu_state([s for s in smi if "t0" in c and
                            c["t0"] <= s[0] <= c["t0"] + c["profiled_steps"] * c["step_ms"] / 1e3])
            row = {"lease": lease, "resolution": res, "step_ms": {k: round(v, 1) for k, v in step.items()},
                   "tables_ms": {k: round(v, 1) for k, v in tables.items()},
                   "ratio": {k: round(step[k] / tables[k], 3) for k in step}, "sm_mhz": st["sm_mhz"]}
            by_kind.append(row)
            mhz = f"{st['sm_mhz']:.0f}" if st["sm_mhz"] else ""
            lines.append(f"{lease:<16}{res:>6}" + "".join(
                f"{step[k]:>10.1f} /{tables[k]:>7.1f} ={row['ratio'][k]:>6.3f}" for k in step) + f"{mhz:>8}")
    return by_kind


def clocked_steps(cocodiff, lines):
    """The 1-GPU steps with the GPU's clocks, measured against predicted."""
    clocks, predicted = [], {}
    lines += ["", "# The flat 1-GPU steps at 512^2-2048^2 with the GPU's clocks (configs/measurements/h200x1-clocks*/:"
              " 2 warm-up and 30 timed steps each), ms a step measured / predicted (hgx-h200), and the GPU over the"
              " last two thirds of the timed steps",
              f"{'lease':<16}{'res':>6}{'measured':>10}{'predicted':>10}{'error':>8}{'host ms':>9}{'SM MHz':>8}{'W':>6}"
              f"{'capped':>7}"]
    for d in sorted(glob.glob(os.path.join(M, "h200x1-clocks*"))):
        lease = os.path.basename(d)
        smi = samples(d)
        rows = {int(r["resolution"]): r for r in readers.read_csv(os.path.join(d, "steps_nvlink.csv"))}
        for sp in readers.read_json(os.path.join(d, "steps_spans_nvlink.json")):
            res = sp["resolution"]
            r = rows[res]
            ms = float(r["median_ms"])
            start = sp["t0"] + 2 * ms / 1e3  # after the warm-ups
            window = [s for s in smi if start <= s[0] <= sp["t1"]]
            st = gpu_state(window[len(window) // 3:])
            if res not in predicted:  # the same prediction for every lease
                predicted[res] = run_phantom_step(cocodiff, 1, res, "flat", 1,
                                                  ["cluster.preset=hgx-h200"])["virtual_time_s"] * 1e3
            pred = predicted[res]
            row = {"lease": lease, "resolution": res, "step_ms": ms, "step_ms_predicted": round(pred, 2),
                   "host_issue_ms": float(r["host_issue_ms"]), "timed_steps": int(r["timed_steps"]), **st}
            clocks.append(row)
            lines.append(f"{lease:<16}{res:>6}{ms:>10.1f}{pred:>10.1f}{100 * (pred / ms - 1):>7.1f}%"
                         f"{row['host_issue_ms']:>9.1f}{st['sm_mhz'] or 0:>8.0f}{st['power_w'] or 0:>6.0f}"
                         f"{st['capped'] or 0:>7.2f}")
    return clocks


def main(argv=None):
    a = cli.analysis_parser(__doc__).parse_args(argv)
    lines = []
    kernels, steps = pace_kernels(lines)
    factor = preset_step_factor()
    by_kind = profiled_by_kind(a.cocodiff, lines, factor)
    clocks = clocked_steps(a.cocodiff, lines)
    summary = {
        "gemm_attention_sustained_over_first": sorted(
            r["sustained_over_first"] for r in kernels if r["op"] in ("linear", "sdpa")),
        "memory_bound_sustained_over_first": sorted(
            r["sustained_over_first"] for r in kernels if r["op"] not in ("linear", "sdpa")),
        "cold_over_warm": sorted(r["cold_over_warm"] for r in kernels),
        "preset_step_factor": factor,
    }
    lines += ["", json.dumps(summary, indent=1)]
    report.write_table(a.out, "pace_fidelity", lines,
                       {"kernels": kernels, "steps": steps, "by_kind": by_kind, "clocks": clocks, "summary": summary})


if __name__ == "__main__":
    main()
