#!/usr/bin/env python3
"""Tables from the study's compare.json files (bench/study/run_study.sh)."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "results")
rows = []
for f in sorted(out.glob("*/compare.json")):
    d = json.loads(f.read_text())
    for e in d["entries"]:
        rows.append((f.parent.name, e))

print("| run | strategy | ranks | steps | virtual s | s/step | speedup vs flat | exposed comm | "
      "inter-node GB | V-Major saved (inter-node) | rel L2 | PSNR dB | SSIM |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
speedups = []
for name, e in rows:
    q = e.get("quality") or {}
    vm = e.get("strategy_stats", {}).get("v_major", {}).get("tiers", {}).get("inter-node")
    saved = f"{100 * vm['saved_fraction']:.1f}%" if vm else ""
    b = e["breakdown"]
    rel = f"{q['latent_relative_l2']:.2e}" if q else ""
    psnr = q.get("preview_psnr_db", "") if q else ""
    psnr = f"{psnr:.2f}" if isinstance(psnr, float) else psnr
    ssim = f"{q['preview_ssim']:.4f}" if q else ""
    print(f"| {name} | {e.get('entry', e['strategy'])} | {e['ranks']} | {e['steps']} | {e['virtual_time_s']:.4f} | "
          f"{e['virtual_time_s'] / e['steps']:.4f} | {e['speedup_vs_flat']:.2f} | "
          f"{100 * b['exposed_comm_fraction']:.1f}% | {e['bytes_by_tier']['inter-node'] / 1e9:.3f} | "
          f"{saved} | {rel} | {psnr} | {ssim} |")
    if e["strategy"] == "cocodiff" and e["math"] == "skip" and not e.get("technique"):
        speedups.append((name, e["speedup_vs_flat"]))
if speedups:
    vals = [s for _, s in speedups]
    best = max(speedups, key=lambda t: t[1])
    print()
    print(f"cocodiff over flat, phantom runs: mean {sum(vals) / len(vals):.2f}x over {len(vals)} "
          f"configs, peak {best[1]:.2f}x ({best[0]})")
