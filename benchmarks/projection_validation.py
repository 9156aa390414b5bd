"""Tabulates `nectar fit --project` against `nectar bench replay` (benchmarks/RESULTS.md, "The
projection validated …"): usage `projection_validation.py DIR TAG`, where DIR holds what
benchmarks/projection_validation.sh writes: fit{TAG}-BUDGET-PREFETCH.json,
replay{TAG}-BUDGET-PREFETCH-ROUND.json (one arm each, alternated), optionally
replay{TAG}-BUDGET-mtp-1.json (MTP on, look-ahead) and prefill{TAG}.json."""
import glob
import json
import os
import re
import statistics
import sys

O, TAG = sys.argv[1], sys.argv[2]


def load(path):
    try:
        return json.load(open(path))["runs"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None  # an arm cut off by a time limit


arms = {}
for path in sorted(glob.glob(f"{O}/replay{TAG}-*.json")):
    m = re.fullmatch(rf"replay{re.escape(TAG)}-(\w+)-(off|lookahead|mtp)-(\d+)\.json", os.path.basename(path))
    run = m and load(path)
    if run:
        arms.setdefault((m[1], m[2]), []).append(run)

print("| budget | slots | arm | projected tok/s | measured tok/s (replay; median, each round) | **projected ÷ measured** "
      "| hit rate: projection / replay | η / o (ms per layer), calibration | disk GB/s: fit / replay raw "
      "| look-ahead coverage: projection / replay | min context: projection / replay |")
print("|---|---:|---|---:|---|---:|---|---|---|---|---|")
ratios = []
budgets = sorted({b for b, _ in arms}, key=lambda b: float(b.rstrip("MG")) * (1024 if b.endswith("G") else 1))
for b in budgets:
    for pf in ("off", "lookahead", "mtp"):
        runs = arms.get((b, pf))
        fit = f"{O}/fit{TAG}-{b}-{'off' if pf == 'off' else 'lookahead'}.json"
        if not runs or not os.path.exists(fit):
            continue
        f = json.load(open(fit))
        p, mach = f["projection"], f["machine"]
        key = "mtp_on" if pf == "mtp" else "mtp_off"
        proj = p["decode_tok_s"][key]
        each = [r["decode_tok_s"] for r in runs]
        meas = statistics.median(each)
        ratios.append(proj / meas)
        run = runs[0]
        raw = [x for r in runs for x in (r["raw_gb_s"]["before"], r["raw_gb_s"]["after"])]
        lc = run.get("lookahead_control") or {}
        hit = statistics.median(r["hit_rate"] for r in runs)
        cov = statistics.median(r["prefetch_coverage"] for r in runs)
        print(f"| {b} | {run['lru_slots_per_layer']} | {pf if pf != 'mtp' else 'MTP on, look-ahead'} | {proj:.2f} "
              f"| {meas:.2f} ({', '.join(f'{x:.2f}' for x in each)}) | **{proj / meas:.2f}** "
              f"| {p['hit_rate'][key]:.3f} / {hit:.3f} "
              f"| {mach['moe_overlap']:.2f} / {mach['layer_overhead_ms']:.2f} "
              f"| {mach['disk_gbps']:.2f} / {min(raw):.2f}–{max(raw):.2f} "
              f"| {p['prefetch']['coverage']:.2f} / {cov:.2f} "
              f"| {p['prefetch'].get('min_context') or '–'} / {lc.get('min_context', '–')} |")
    off, on = arms.get((b, "off")), arms.get((b, "lookahead"))
    if off and on:
        f_off = json.load(open(f"{O}/fit{TAG}-{b}-off.json"))["projection"]["decode_tok_s"]["mtp_off"]
        f_on = json.load(open(f"{O}/fit{TAG}-{b}-lookahead.json"))["projection"]["decode_tok_s"]["mtp_off"]
        g = statistics.median(r["decode_tok_s"] for r in on) / statistics.median(r["decode_tok_s"] for r in off)
        print(f"|  | | look-ahead gain | {f_on / f_off:.2f}× | {g:.2f}× | | | | | | |")
print()
if ratios:
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
