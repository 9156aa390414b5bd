"""Tabulates `nectar fit --project` against `nectar bench replay` (benchmarks/RESULTS.md, "The
projection validated on a quiet machine"): usage `projection_validation.py DIR TAG`, where DIR holds
fit{TAG}-BUDGET-PREFETCH.json and replay{TAG}-BUDGET.json."""
import json
import sys
O, TAG = sys.argv[1], sys.argv[2]
print("| budget | slots | prefetch | projected tok/s | measured tok/s (replay) | projected ÷ measured | hit: trace-wide (projection) / these conversations (replay) | disk GB/s: fit / replay raw | min context (fit / replay) |")
print("|---|---:|---|---:|---:|---:|---|---|---|")
for b in ["2100M","2950M","4250M"]:
    r=json.load(open(f"{O}/replay{TAG}-{b}.json"))
    for run in r["runs"]:
        pf=run["prefetch"]
        f=json.load(open(f"{O}/fit{TAG}-{b}-{pf}.json")); p=f["projection"]; m=f["machine"]
        proj=p["decode_tok_s"]["mtp_off"]; meas=run["decode_tok_s"]
        raw=run.get("raw_gb_s")
        rawv = raw if isinstance(raw,(int,float)) else (raw.get("mean") if isinstance(raw,dict) else raw)
        lc=run.get("lookahead_control") or {}
        print(f"| {b} | {run['lru_slots_per_layer']} | {pf} | {proj:.2f} | {meas:.2f} | **{proj/meas:.2f}** | {p['hit_rate']['mtp_off']:.3f} / {run['hit_rate']:.3f} | {m['disk_gbps']:.2f} / {raw['before']:.2f}–{raw['after']:.2f} | {p['prefetch'].get('min_context') or '–'} / {(lc or {}).get('min_context', '–')} |")
    print()
