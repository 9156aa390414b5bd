"""Tabulates `nectar fit --project` against `nectar bench replay` (benchmarks/RESULTS.md, "The
projection validated on a quiet machine"): usage `projection_validation.py DIR TAG`, where DIR
holds fit{TAG}-BUDGET-PREFETCH.json, replay{TAG}-BUDGET.json and (optionally) prefill{TAG}.json,
as benchmarks/projection_validation.sh writes them."""
import json
import os
import sys

O, TAG = sys.argv[1], sys.argv[2]
BUDGETS = ["2100M", "2950M", "4250M"]
print("| budget | slots | prefetch | projected tok/s | measured tok/s (replay) | projected ÷ measured "
      "| hit rate: projection / replay | η / o (ms per layer), calibration | disk GB/s: fit / replay raw "
      "| look-ahead coverage: projection / replay | min context: projection / replay |")
print("|---|---:|---|---:|---:|---:|---|---|---|---|---|")
ratios = []
for b in BUDGETS:
    r = json.load(open(f"{O}/replay{TAG}-{b}.json"))
    for run in r["runs"]:
        pf = run["prefetch"]
        f = json.load(open(f"{O}/fit{TAG}-{b}-{pf}.json"))
        p, m = f["projection"], f["machine"]
        proj, meas = p["decode_tok_s"]["mtp_off"], run["decode_tok_s"]
        ratios.append(proj / meas)
        raw = run["raw_gb_s"]
        lc = run.get("lookahead_control") or {}
        print(f"| {b} | {run['lru_slots_per_layer']} | {pf} | {proj:.2f} | {meas:.2f} | **{proj / meas:.2f}** "
              f"| {p['hit_rate']['mtp_off']:.3f} / {run['hit_rate']:.3f} "
              f"| {m['moe_overlap']:.2f} / {m['layer_overhead_ms']:.2f} "
              f"| {m['disk_gbps']:.2f} / {raw['before']:.2f}–{raw['after']:.2f} "
              f"| {p['prefetch']['coverage']:.2f} / {run['prefetch_coverage']:.2f} "
              f"| {p['prefetch'].get('min_context') or '–'} / {lc.get('min_context', '–')} |")
print()
print(f"projected ÷ measured, decode: {min(ratios):.2f}–{max(ratios):.2f}")
pre = f"{O}/prefill{TAG}.json"
if os.path.exists(pre):
    runs = json.load(open(pre))["prefill"]
    print()
    print("| budget | prompt tokens | projected prefill tok/s | measured (replay) | projected ÷ measured | GB read ÷ touched |")
    print("|---|---:|---:|---:|---:|---:|")
    for run in runs:
        b, n = run["budget"], run["prompt_tokens"]
        f = json.load(open(f"{O}/fit{TAG}-{b}-off.json"))
        proj = f["projection"]["prefill_tok_s"].get(str(n))
        if proj is None:
            continue
        print(f"| {b} | {n} | {proj:.2f} | {run['prefill_tok_s']:.2f} | **{proj / run['prefill_tok_s']:.2f}** "
              f"| {run['read_ratio_to_touched']:.2f} |")
