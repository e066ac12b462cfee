#!/usr/bin/env python3
"""The host-bound 1024^2 steps, predicted machine by machine once that machine's host speed is known.

Between machines the same host-bound step varies by up to 2x (steps_fidelity.txt, the 1024^2
ranges), while every 2048^2 step agrees within a few percent: the hosts differ, the GPUs do not.
One preset has one host speed (`device.host.step_factor`), so it can only fall inside the range.
This script asks the other question: given one step of a machine, are the machine's other
host-bound steps predicted? For each measured machine and transport it fits the host step
factor to ONE step, the flat step on the most GPUs that machine ran (bisection on cocodiff's
prediction, every other figure of the preset as shipped), then predicts the machine's other
1024^2 steps (the other strategies, the other GPU counts) with it, and prints measured /
predicted / error and each strategy's speedup over flat. The fitted factors' spread is the
machines' host speed spread; the errors left are the model's own.

Then one rank alone (configs/measurements/h200x1-host*/): the flat 1-GPU steps at 256^2 and
512^2, host-bound on one GPU, against the shipped preset (a run of one rank takes the host's op
issue costs as measured, without the multi-rank step factor), and the same 1-GPU step with its
exchanges made over a group of one rank (steps1x_nvlink.csv): what each exchange adds to the
host's issue time with no peer to wait for. Then whether a larger host cost of each collective
call of its own (device.host.collective_issue_us, tried at 100-200 us with every machine's step
factor fitted again) predicts the machines' other strategies better, and that exchange's host
path on one rank part by part (configs/measurements/h200x1-hostx*/hostx_nvlink*.json): the NCCL
call alone and beside a RoPE, against what each exchange adds to a host-bound step on the same
lease; and the exchanging steps with PyTorch's record-stream bookkeeping of NCCL's tensors and
without it (TORCH_NCCL_AVOID_RECORD_STREAMS=1, configs/measurements/h200x1-hostrs*/).

Usage: host_fidelity.py COCODIFF [--out DIR]
Writes DIR/host_fidelity.{txt,json} (default bench/fidelity/results).
"""
import glob, json, math, os, statistics, subprocess, sys, tempfile

from cocodiff_fidelity import cli, paths, readers, report
from cocodiff_fidelity.phantom import STRATEGY, preset_for, run_phantom_step
from cocodiff_fidelity.readers import read_steps

STEPS = 2
RES = 1024
BLOCKS = 19 + 38  # FLUX.1-dev's double and single blocks
# the exchanges of one block, as measure_multi.py's Step makes them: Q, K and V to heads, the
# output back to tokens and the text gathered; pipelined, Q and K go in 2 head groups each
EXCHANGES = {"flat": 5, "v_first": 5, "pipeline": 7, "cocodiff": 7}
LOW, HIGH = 0.5, 4.0  # the host factors searched (the shipped presets: 1.71 on H200, 1.85 on H100)


class StepModel:
    """Phantom steps of one cocodiff binary, each run once."""

    def __init__(self, cocodiff):
        self.cocodiff = cocodiff
        self.cache = {}

    def __call__(self, machine, transport, w, strategy, factor, res=RES, issue_us=None, preset=None):
        """One step's ms with the host step factor `factor` (None: the preset's), each collective
        call's host cost `issue_us` (None: the preset's device.host.collective_issue_us) and the
        cluster file `preset` (None: the shipped preset of the machine's GPU and transport)."""
        return self.step_ms(machine, transport, w, strategy, factor, res, issue_us, preset)

    def step_ms(self, machine, transport, w, strategy, factor, res, issue_us, preset):
        cache = self.cache
        key = (machine[:4], transport, w, strategy, factor and round(factor, 6), res, issue_us, preset)
        if key in cache:
            return cache[key]
        sets = [f"cluster.preset={preset or preset_for(machine, transport)}"]
        if issue_us is not None:
            sets.append(f"cluster.device.host.collective_issue_us={issue_us}")
        if factor is not None:
            sets.append(f"cluster.device.host.step_factor={factor:.6f}")
        r = run_phantom_step(self.cocodiff, w, res, STRATEGY[strategy], STEPS, sets)
        cache[key] = r["virtual_time_s"] / STEPS * 1e3
        return cache[key]


def fit(predict, machine, transport, w, target, issue_us=None):
    """The host step factor at which the flat step on w GPUs takes `target` ms, by bisection
    (the step grows with the factor); LOW or HIGH when the target is outside their range."""
    lo, hi = LOW, HIGH
    if predict(machine, transport, w, "flat", lo, issue_us=issue_us) >= target:
        return lo
    if predict(machine, transport, w, "flat", hi, issue_us=issue_us) <= target:
        return hi
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        if predict(machine, transport, w, "flat", mid, issue_us=issue_us) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def one_rank(predict, lines, summary):
    """The one-rank sections: host-bound 1-GPU steps against the preset, and what exchanges over
    a group of one rank add to them."""
    plain, exch = {}, {}
    for path in sorted(glob.glob(os.path.join(paths.ROOT, "configs/measurements/h*x1-host*/steps*_nvlink*.csv"))):
        machine = os.path.basename(os.path.dirname(path))
        if "_avoid" in os.path.basename(path) or os.path.basename(path).startswith("steps1c_"):
            continue  # record-stream bookkeeping off, or copies for exchanges (sections below)
        into = exch if os.path.basename(path).startswith("steps1x_") else plain
        for r in readers.read_csv(path):
            into.setdefault((machine, int(r["resolution"]), r["strategy"]), []).append(
                (float(r["median_ms"]), float(r["host_issue_ms"])))
    if not plain:
        return
    lines += ["", "## one rank alone: flat 1-GPU steps, each launch (host-bound at 256^2 and 512^2; "
              "host issue = the host's time to issue the step)",
              f"{'machine':<16}{'res':>5}{'launches':>9}{'step ms':>22}{'host issue ms':>22}{'predicted':>11}"
              f"{'error (median)':>16}"]
    errs = []
    for (machine, res, st), runs in sorted(plain.items()):
        pred = predict(machine, "nvlink", 1, st, None, res)
        med = statistics.median(t for t, _ in runs)
        err = 100 * (pred / med - 1)
        if res <= 512:
            errs.append(err)
        lines.append(f"{machine:<16}{res:>5}{len(runs):>9}{' / '.join(f'{t:.1f}' for t, _ in runs):>22}"
                     f"{' / '.join(f'{h:.1f}' for _, h in runs):>22}{pred:>11.1f}{err:>15.1f}%")
    summary["one_rank_host_bound"] = {"steps": len(errs), "errors_pct": sorted(round(e, 1) for e in errs)}
    own_op_costs(predict, lines, summary, plain)
    if not exch:
        return
    lines += ["", "## one rank, exchanging over a group of one rank (steps1x_nvlink.csv) against the plain "
              "flat step of the same launch set: the host time the exchanges add",
              f"{'machine':<16}{'res':>5} {'strategy':<9}{'host issue':>11}{'plain flat':>11}{'added':>8}"
              f"{'exchanges':>10}{'us each':>9}"]
    per, each = [], {}
    for (machine, res, st), runs in sorted(exch.items()):
        base = plain.get((machine, res, "flat"))
        if not base:
            continue
        host = statistics.median(h for _, h in runs)
        flat = statistics.median(h for _, h in base)
        n = EXCHANGES[st] * BLOCKS
        added = host - flat
        if res <= 512:
            per.append(added * 1e3 / n)
            each[(machine, res, st)] = added * 1e3 / n
        lines.append(f"{machine:<16}{res:>5} {st:<9}{host:>11.1f}{flat:>11.1f}{added:>8.1f}{n:>10}"
                     f"{added * 1e3 / n:>9.0f}")
    if per:
        summary["one_rank_exchange_added_us_each_host_bound"] = sorted(round(x) for x in per)
    return each


def own_op_costs(predict, lines, summary, plain):
    """The host-bound 1-GPU steps predicted with their own lease's op issue costs: `cocodiff
    calibrate` fits hgx-h200's [device.host] to the lease's host_nvlink.csv, and the step runs on
    the file it writes. Does timing the ops on a machine predict its host-bound step?"""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for machine in sorted({m for m, res, st in plain if res <= 512}):
            csv_path = os.path.join(paths.ROOT, "configs/measurements", machine, "host_nvlink.csv")
            if not os.path.exists(csv_path):
                continue
            fit_path = os.path.join(tmp, f"{machine}.toml")
            p = subprocess.run([predict.cocodiff, "calibrate", "--cluster", preset_for(machine, "nvlink"), "--out",
                                fit_path, csv_path], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"cocodiff calibrate failed ({p.returncode}) on {csv_path}\n{p.stderr}")
            for res in (256, 512):
                runs = plain.get((machine, res, "flat"))
                if not runs:
                    continue
                med = statistics.median(t for t, _ in runs)
                shipped = predict(machine, "nvlink", 1, "flat", None, res)
                own = predict(machine, "nvlink", 1, "flat", None, res, preset=fit_path)
                rows.append((machine, res, med, shipped, own))
    if not rows:
        return
    lines += ["", "## the same host-bound 1-GPU steps with their own lease's op issue costs (cocodiff calibrate on its "
              "host_nvlink.csv)",
              f"{'machine':<16}{'res':>5}{'measured':>10}{'shipped':>9}{'error':>8}{'own ops':>9}{'error':>8}"]
    e_ship, e_own = [], []
    for machine, res, med, shipped, own in rows:
        e_ship.append(100 * (shipped / med - 1))
        e_own.append(100 * (own / med - 1))
        lines.append(f"{machine:<16}{res:>5}{med:>10.1f}{shipped:>9.1f}{e_ship[-1]:>7.1f}%{own:>9.1f}{e_own[-1]:>7.1f}%")
    out = {}
    for label, errs in (("shipped", e_ship), ("own_op_costs", e_own)):
        out[label] = {"median_abs_error_pct": round(statistics.median(abs(e) for e in errs), 1),
                      "within_10pct": sum(abs(e) <= 10 for e in errs), "min_pct": round(min(errs), 1),
                      "max_pct": round(max(errs), 1)}
        lines.append(f"{label}: median {out[label]['median_abs_error_pct']}% off, {out[label]['within_10pct']} of "
                     f"{len(errs)} within 10%, {out[label]['min_pct']:+.1f}% to {out[label]['max_pct']:+.1f}%")
    out["steps"] = len(rows)
    summary["one_rank_host_bound_own_op_costs"] = out


ISSUE_SWEEP = (100.0, 150.0, 200.0)  # us: a collective call's host cost tried in place of the preset's


def issue_sweep(predict, lines, summary, groups):
    """Does a larger host cost of its own for each collective call (device.host.collective_issue_us,
    which the step factor does not scale) predict a machine's other strategies better? Each value
    is tried with every machine's step factor fitted again, as above."""
    lines += ["", "## each collective call's own host cost raised (device.host.collective_issue_us; shipped: NVLink H200 49.6, "
              "H100 50.2; shared memory 40.3, 32.0), "
              "every machine's step factor fitted again: its other steps on the same GPUs",
              f"{'issue us':>9} {'gpu':<5}{'factors (median)':>22}{'within 10%':>12}{'median err':>12}"
              f"{'speedups within 5 pts':>23}{'all steps within 10%':>22}"]
    sweep = [("shipped", {g: summary[g] for g in ("h100", "h200") if g in summary})]
    for us in ISSUE_SWEEP:
        sweep.append((f"{us:.0f}", fit_summary(*machine_fits(predict, groups, us))))
    for label, by_gpu in sweep:
        for gpu, s in sorted(by_gpu.items()):
            same, every = s["same_gpus"], s["all"]
            lines.append(f"{label:>9} {gpu:<5}{s['factor_min']:>9.2f}-{s['factor_max']:.2f} ({s['factor_median']:.2f})"
                         f"{same['within_10pct']:>6} of {same['steps']:<3}{same['median_abs_error_pct']:>11.2f}%"
                         f"{same['speedup_within_5_points']:>16} of {same['speedups']:<4}"
                         f"{every['within_10pct']:>15} of {every['steps']:<4}")
        if label != "shipped":
            summary.setdefault("collective_issue_sweep", {})[label] = {
                gpu: {"factor_median": s["factor_median"], "same_gpus_within_10pct": s["same_gpus"]["within_10pct"],
                      "same_gpus_median_abs_error_pct": s["same_gpus"]["median_abs_error_pct"],
                      "same_gpus_speedup_within_5_points": s["same_gpus"]["speedup_within_5_points"],
                      "all_within_10pct": s["all"]["within_10pct"]} for gpu, s in by_gpu.items()}


def launches(d, files):
    """The host issue ms of the steps CSVs of directory d, by kind of launch: {(resolution,
    strategy): {kind: [one per file that exists, in the order given]}}; `files` {kind: [names]}."""
    by = {}
    for kind, names in files.items():
        for name in names:
            path = os.path.join(d, name)
            if os.path.exists(path):
                for r in readers.read_csv(path):
                    by.setdefault((int(r["resolution"]), r["strategy"]), {}).setdefault(kind, []).append(
                        float(r["host_issue_ms"]))
    return by


def record_streams(lines, summary):
    """The one-rank exchanging steps of h*x1-hostrs*/ with PyTorch's record-stream bookkeeping of
    NCCL's tensors (steps1x_nvlink.csv, steps1x_nvlink_again.csv) and without it
    (TORCH_NCCL_AVOID_RECORD_STREAMS=1: steps1x_nvlink_avoid.csv, steps1x_nvlink_avoid2.csv),
    launched in turn on one lease: host issue ms of each launch."""
    files = {"with": ["steps1x_nvlink.csv", "steps1x_nvlink_again.csv"],
             "without": ["steps1x_nvlink_avoid.csv", "steps1x_nvlink_avoid2.csv"]}
    rows = []
    for d in sorted(glob.glob(os.path.join(paths.ROOT, "configs/measurements/h*x1-hostrs*"))):
        for (res, st), x in sorted(launches(d, files).items()):
            rows.append((os.path.basename(d), res, st, x.get("with", []), x.get("without", [])))
    if not rows:
        return
    lines += ["", "## one rank exchanging over a group of one rank, with and without PyTorch's record-stream "
              "bookkeeping of NCCL's tensors (TORCH_NCCL_AVOID_RECORD_STREAMS=1), launched in turn: host issue ms",
              f"{'machine':<16}{'res':>5} {'strategy':<9}{'default launches':>20}{'without':>20}{'ratio':>8}"]
    ratios, spreads = [], []
    for machine, res, st, de, av in rows:
        ratio = statistics.mean(av) / statistics.mean(de)
        ratios.append(ratio)
        spreads += [max(v) / min(v) for v in (de, av) if len(v) > 1]
        lines.append(f"{machine:<16}{res:>5} {st:<9}{' / '.join(f'{v:.1f}' for v in de):>20}"
                     f"{' / '.join(f'{v:.1f}' for v in av):>20}{ratio:>8.2f}")
    gmean = math.exp(statistics.mean(math.log(r) for r in ratios))
    lines.append(f"without / with: geometric mean {gmean:.3f} ({min(ratios):.2f} to {max(ratios):.2f}), lower in "
                 f"{sum(r < 1 for r in ratios)} of {len(ratios)}; the same setting launched twice differs by "
                 f"{statistics.median(spreads):.2f}x in median, {max(spreads):.2f}x at most")
    summary["one_rank_avoid_record_streams"] = {
        "pairs": len(ratios), "ratio_geometric_mean": round(gmean, 3), "ratio_min": round(min(ratios), 2),
        "ratio_max": round(max(ratios), 2), "lower": sum(r < 1 for r in ratios),
        "same_setting_launch_spread_median": round(statistics.median(spreads), 2),
        "same_setting_launch_spread_max": round(max(spreads), 2)}


def exchange_copies(lines, summary):
    """The one-rank exchanging steps of h*x1-hostcopy*/ with NCCL (steps1x_nvlink.csv, _again)
    and with each exchange a copy on the compute stream instead (steps1c_nvlink.csv, _again: the
    same tensors and kernels, no collective), launched in turn, against the plain flat step of the
    first launch: what each exchange adds to the host, by the collective and by its tensors."""
    rows = []
    for d in sorted(glob.glob(os.path.join(paths.ROOT, "configs/measurements/h*x1-hostcopy*"))):
        plain = {res: x["plain"][0] for (res, _), x in launches(d, {"plain": ["steps_nvlink.csv"]}).items()}
        by = launches(d, {"nccl": ["steps1x_nvlink.csv", "steps1x_nvlink_again.csv"],
                          "copy": ["steps1c_nvlink.csv", "steps1c_nvlink_again.csv"]})
        for (res, st), x in sorted(by.items()):
            if res in plain and "nccl" in x and "copy" in x:
                rows.append((os.path.basename(d), res, st, plain[res], x["nccl"], x["copy"]))
    if not rows:
        return
    lines += ["", "## one rank, each exchange over NCCL (a group of one rank) or a copy on the compute stream instead, "
              "launched in turn: host issue ms; us each exchange costs over NCCL more than as a copy, and as a copy more "
              "than the plain flat step of the first launch (noisy: one launch)",
              f"{'machine':<18}{'res':>5} {'strategy':<9}{'plain':>7}{'NCCL launches':>17}{'copy launches':>17}"
              f"{'NCCL-copy':>10}{'copy-plain':>11}"]
    nccl_us, copy_us, spread = {}, {}, {"nccl": [], "copy": []}
    for machine, res, st, base, nc, cp in rows:
        n = EXCHANGES[st] * BLOCKS
        a = (statistics.mean(nc) - statistics.mean(cp)) * 1e3 / n
        b = (statistics.mean(cp) - base) * 1e3 / n
        nccl_us.setdefault(st, []).append(a)
        copy_us.setdefault(st, []).append(b)
        spread["nccl"].append(max(nc) / min(nc))
        spread["copy"].append(max(cp) / min(cp))
        lines.append(f"{machine:<18}{res:>5} {st:<9}{base:>7.1f}{' / '.join(f'{v:.1f}' for v in nc):>17}"
                     f"{' / '.join(f'{v:.1f}' for v in cp):>17}{a:>10.0f}{b:>11.0f}")
    out = {}
    for st in sorted(nccl_us):
        out[st] = {"nccl_over_copy_us_each": [round(min(nccl_us[st])), round(max(nccl_us[st]))],
                   "copy_over_plain_us_each": [round(min(copy_us[st])), round(max(copy_us[st]))]}
        lines.append(f"{st}: each exchange costs {min(nccl_us[st]):.0f} to {max(nccl_us[st]):.0f} us more over NCCL "
                     f"than as a copy; as a copy {min(copy_us[st]):.0f} to {max(copy_us[st]):.0f} us over the plain step")
    for kind in ("nccl", "copy"):
        out[f"{kind}_launch_spread_median"] = round(statistics.median(spread[kind]), 2)
        out[f"{kind}_launch_spread_max"] = round(max(spread[kind]), 2)
    lines.append(f"the same step launched twice: {out['nccl_launch_spread_median']:.2f}x in median "
                 f"({out['nccl_launch_spread_max']:.2f}x at most) over NCCL, {out['copy_launch_spread_median']:.2f}x "
                 f"({out['copy_launch_spread_max']:.2f}x) as copies")
    summary["one_rank_exchange_nccl_or_copy"] = out


HOSTX_CASES = ("a2a", "a2a_alloc", "a2a_blocking", "rope", "rope_a2a_alloc")


def exchange_parts(lines, summary, each):
    """The exchange's host path on one rank part by part (hostx_nvlink*.json of h*x1-hostx*/):
    the NCCL call alone against what each exchange adds to a step on the same lease (`each`, from
    one_rank), and a RoPE followed by the exchange against the two apart."""
    files = sorted(glob.glob(os.path.join(paths.ROOT, "configs/measurements/h*x1-hostx*/hostx_nvlink*.json")))
    if not files:
        return
    lines += ["", "## the exchange's host path on one rank, part by part (hostx_nvlink*.json): CPU time of the "
              "issuing thread per call, median of 5 rounds of 100 (us); beside = RoPE then exchange, less "
              "the two apart",
              f"{'machine':<16}{'launch':>7}{'tokens':>7}" + "".join(f"{c:>15}" for c in HOSTX_CASES)
              + f"{'beside':>9}{'wall/CPU':>10}"]
    calls, extra, extra_pct = [], [], []
    for path in files:
        machine = os.path.basename(os.path.dirname(path))
        launch = os.path.basename(path)[len("hostx_nvlink"):-len(".json")] or "1"
        by = {}
        for c in readers.read_json(path)["cases"]:
            by.setdefault(c["tokens"], {})[c["case"]] = c
        for tokens, cases in sorted(by.items()):
            if any(c not in cases for c in HOSTX_CASES):
                continue
            cpu = {c: statistics.median(cases[c]["cpu_us"]) for c in HOSTX_CASES}
            ratio = max(statistics.median(cases[c]["wall_us"]) / cpu[c] for c in HOSTX_CASES)
            beside = cpu["rope_a2a_alloc"] - cpu["rope"] - cpu["a2a_alloc"]
            calls.append(cpu["a2a_alloc"])
            extra.append(beside)
            extra_pct.append(100 * beside / (cpu["rope"] + cpu["a2a_alloc"]))
            lines.append(f"{machine:<16}{launch:>7}{tokens:>7}" + "".join(f"{cpu[c]:>15.1f}" for c in HOSTX_CASES)
                         + f"{beside:>9.1f}{ratio:>10.3f}")
    steps = sorted(v for (m, _, st), v in each.items() if st == "flat" and "hostx" in m)
    med = statistics.median
    lines += [f"the call with its buffer (a2a_alloc): median {med(calls):.1f} us ({min(calls):.1f} to {max(calls):.1f}); "
              f"a RoPE then the exchange: median {med(extra):+.1f} us ({med(extra_pct):+.0f}%) over the two apart "
              f"({min(extra):+.1f} to {max(extra):+.1f})"
              + (f"; each flat exchange adds {steps[0]:.0f} to {steps[-1]:.0f} us to a host-bound step on the same "
                 f"leases" if steps else "")]
    summary["one_rank_exchange_parts"] = {
        "call_with_buffer_us_median_min_max": [round(med(calls), 1), round(min(calls), 1), round(max(calls), 1)],
        "rope_then_exchange_extra_us_median_min_max": [round(med(extra), 1), round(min(extra), 1), round(max(extra), 1)],
        "rope_then_exchange_extra_pct_median": round(med(extra_pct), 1),
        "flat_exchange_in_step_us_same_leases": [round(steps[0]), round(steps[-1])] if steps else None}


def spread(lines, summary):
    """How far the timed steps of one measurement spread: (max - min) / median of each row of the
    multi-GPU steps files, by GPU and resolution."""
    by, one = {}, {}
    for path in glob.glob(os.path.join(paths.ROOT, "configs/measurements/h[12]00x*/steps_*.csv")):
        gpu = os.path.basename(os.path.dirname(path))[:4]
        for r in readers.read_csv(path):
            if int(r["gpus"]) == 1 and int(r["resolution"]) == RES:
                one.setdefault(gpu, []).append(float(r["host_issue_ms"]))
            if int(r["gpus"]) > 1:
                by.setdefault((gpu, int(r["resolution"])), []).append(
                    100 * (float(r["max_ms"]) - float(r["min_ms"])) / float(r["median_ms"]))
    lines += ["", "## the spread of one measurement's timed steps, (max - min) / median, multi-GPU steps",
              f"{'gpu':<6}{'res':>6}{'rows':>6}{'median %':>10}{'90th pct %':>12}"]
    for (gpu, res), v in sorted(by.items()):
        v.sort()
        p90 = v[int(0.9 * len(v))]
        lines.append(f"{gpu:<6}{res:>6}{len(v):>6}{statistics.median(v):>10.1f}{p90:>12.1f}")
        summary.setdefault("timed_step_spread_pct", {})[f"{gpu}_{res}"] = {
            "rows": len(v), "median": round(statistics.median(v), 1), "p90": round(p90, 1)}
    lines += ["", "## the 1-GPU 1024^2 step's host issue time on every machine (ms)"]
    for gpu, v in sorted(one.items()):
        lines.append(f"{gpu}: {len(v)} launches, {min(v):.1f} to {max(v):.1f} ({100 * (max(v) / min(v) - 1):.1f}%)")
        summary.setdefault("one_gpu_1024_host_issue_ms", {})[gpu] = [min(v), max(v)]


def machine_fits(predict, groups, issue_us=None):
    """Each machine's host step factor fitted to its flat step on the most GPUs it ran, and its
    other 1024^2 steps predicted with it: (factors, rows)."""
    rows, factors = [], []
    for (machine, tr), steps in sorted(groups.items()):
        wref = max(w for w, st in steps if st == "flat") if any(st == "flat" for _, st in steps) else None
        if wref is None:
            continue
        ref = steps[(wref, "flat")]
        f = fit(predict, machine, tr, wref, ref, issue_us)
        factors.append({"machine": machine, "transport": tr, "gpus": wref, "reference_ms": round(ref, 3),
                        "host_step_factor": round(f, 3), "at_bound": f in (LOW, HIGH)})
        for (w, st), ms in sorted(steps.items()):
            if (w, st) == (wref, "flat"):
                continue
            pred = predict(machine, tr, w, st, f, issue_us=issue_us)
            row = {"machine": machine, "transport": tr, "gpus": w, "strategy": st, "reference_gpus": wref,
                   "factor": round(f, 3),
                   "measured_ms": round(ms, 3), "predicted_ms": round(pred, 3),
                   "error_pct": round(100 * (pred / ms - 1), 1)}
            if st != "flat" and (w, "flat") in steps:
                row["speedup_measured"] = round(steps[(w, "flat")] / ms, 3)
                row["speedup_predicted"] = round(predict(machine, tr, w, "flat", f, issue_us=issue_us) / pred, 3)
                row["speedup_diff_points"] = round(100 * (row["speedup_predicted"] - row["speedup_measured"]), 1)
            rows.append(row)
    return factors, rows


def fit_summary(factors, rows):
    """By GPU: the fitted factors' range and how well the other steps are predicted."""
    summary = {}
    for gpu in ("h100", "h200"):
        fs = [f["host_step_factor"] for f in factors if f["machine"].startswith(gpu)]
        sub = [r for r in rows if r["machine"].startswith(gpu)]
        if not sub:
            continue
        out = {"machines_transports": len(fs), "factor_min": min(fs), "factor_median": statistics.median(fs),
               "factor_max": max(fs)}
        for label, part in (("same_gpus", [r for r in sub if r["gpus"] == r["reference_gpus"]]), ("all", sub)):
            errs = [abs(r["error_pct"]) for r in part]
            sd = [r for r in part if "speedup_diff_points" in r]
            sign = [r for r in sd if (r["speedup_measured"] - 1) * (r["speedup_predicted"] - 1) < 0
                    and abs(r["speedup_measured"] - 1) > 0.01]
            out[label] = {"steps": len(errs), "median_abs_error_pct": statistics.median(errs) if errs else None,
                          "within_10pct": sum(e <= 10 for e in errs), "within_20pct": sum(e <= 20 for e in errs),
                          "speedups": len(sd),
                          "speedup_median_abs_diff_points":
                              statistics.median(abs(r["speedup_diff_points"]) for r in sd) if sd else None,
                          "speedup_within_5_points": sum(abs(r["speedup_diff_points"]) <= 5 for r in sd),
                          "speedup_within_10_points": sum(abs(r["speedup_diff_points"]) <= 10 for r in sd),
                          "speedup_sign_disagreements": len(sign)}
        summary[gpu] = out
    return summary


def main(argv=None):
    a = cli.analysis_parser(__doc__).parse_args(argv)
    predict = StepModel(a.cocodiff)
    measured = read_steps()
    groups = {}
    for (machine, tr, w, res, st), runs in measured.items():
        if res == RES and w > 1:
            groups.setdefault((machine, tr), {})[(w, st)] = statistics.median(runs)
    factors, rows = machine_fits(predict, groups)

    lines = ["# 1024^2 steps, each machine's host step factor fitted to its flat step on the most GPUs it ran "
             "(the preset's other figures as shipped), its other steps predicted with it",
             "", "## the fitted host step factors (the machines' host speeds; shipped: H200 1.71, H100 1.85)",
             f"{'machine':<22}{'transport':<10}{'gpus':>4}{'flat ms':>9}{'factor':>8}"]
    for f in factors:
        lines.append(f"{f['machine']:<22}{f['transport']:<10}{f['gpus']:>4}{f['reference_ms']:>9.1f}"
                     f"{f['host_step_factor']:>8.3f}{'  (at the search bound)' if f['at_bound'] else ''}")
    lines += ["", "## the other steps, predicted with their machine's factor",
              f"{'machine':<22}{'transport':<10}{'gpus':>4} {'strategy':<9}{'factor':>7}{'measured':>10}"
              f"{'predicted':>11}{'error':>8}{'speedup m/p':>16}"]
    for r in rows:
        sp = f"{r['speedup_measured']:.3f}/{r['speedup_predicted']:.3f}" if "speedup_measured" in r else ""
        lines.append(f"{r['machine']:<22}{r['transport']:<10}{r['gpus']:>4} {r['strategy']:<9}{r['factor']:>7.3f}"
                     f"{r['measured_ms']:>10.1f}{r['predicted_ms']:>11.1f}{r['error_pct']:>7.1f}%{sp:>16}")

    summary = fit_summary(factors, rows)
    issue_sweep(predict, lines, summary, groups)
    each = one_rank(predict, lines, summary) or {}
    exchange_parts(lines, summary, each)
    record_streams(lines, summary)
    exchange_copies(lines, summary)
    spread(lines, summary)
    lines += ["", json.dumps(summary, indent=1)]
    report.write_table(a.out, "host_fidelity", lines, {"factors": factors, "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
