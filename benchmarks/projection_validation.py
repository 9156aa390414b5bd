"""Tabulates `nectar fit --project` against `nectar bench replay` (benchmarks/RESULTS.md, "The
projection validated …"): usage `projection_validation.py DIR TAG`, where DIR holds what
benchmarks/projection_validation.sh writes: fit{TAG}-BUDGET-PREFETCH.json,
replay{TAG}-BUDGET-PREFETCH-ROUND.json (one arm each, alternated; PREFETCH off, lookahead or
pilot), optionally
replay{TAG}-BUDGET-mtp-ROUND.json (MTP on, look-ahead) and prefill{TAG}.json."""
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


fits = {}


def fit(b, pf):
    """The fit of budget `b` with prefetch `pf` (None when the deadline cut it), read once."""
    if (b, pf) not in fits:
        path = f"{O}/fit{TAG}-{b}-{pf}.json"
        fits[(b, pf)] = json.load(open(path)) if os.path.exists(path) else None
    return fits[(b, pf)]


arms = {}
for path in sorted(glob.glob(f"{O}/replay{TAG}-*.json")):
    m = re.fullmatch(rf"replay{re.escape(TAG)}-(\w+)-(off|lookahead|pilot|mtp)-(\d+)\.json", os.path.basename(path))
    run = m and load(path)
    if run:
        arms.setdefault((m[1], m[2]), []).append(run)

def gain(b, ahead):
    """Prints the row of `ahead`'s gain over off at budget `b`: projected and measured."""
    off, on = arms.get((b, "off")), arms.get((b, ahead))
    if not (off and on):
        return
    f_off, f_on = fit(b, "off"), fit(b, ahead)
    proj = "–"
    if f_off and f_on:
        tok = lambda f: f["projection"]["decode_tok_s"]["mtp_off"]
        proj = f"{tok(f_on) / tok(f_off):.2f}×"
    g = statistics.median(r["decode_tok_s"] for r in on) / statistics.median(r["decode_tok_s"] for r in off)
    # Each run's tok/s × its GB per token ÷ the disk's best rate seen around it
    # (`disk_reference_gb_s`: the higher raw sample, or the decode's own bytes per busy second
    # where its reads moved faster): the share of the disk's rate the decode used, which a
    # drifting disk moves less than tok/s. Runs from before that field: the same from halves.
    def best(r):
        if "disk_reference_gb_s" in r:
            return r["disk_reference_gb_s"]
        h = r.get("halves_ms_per_token") or {}
        busy = (h.get("disk_busy_attention", 0) + h.get("disk_busy_mlp", 0)) / 1e3
        own = r["gb_per_token"] / busy if busy > 0 else 0
        return max(r["raw_gb_s"]["before"], r["raw_gb_s"]["after"], own)
    share = lambda runs: statistics.median(r["decode_tok_s"] * r["gb_per_token"] / best(r) for r in runs)
    print(f"|  | | {ahead} gain | {proj} | {g:.2f}× (share of the disk's best rate used: "
          f"{share(off):.2f} off, {share(on):.2f} {ahead}) | | | | | | |")


print("| budget | slots | arm | projected tok/s | measured tok/s (replay; median, each round) | **projected ÷ measured** "
      "| hit rate: projection / replay | η / o (ms per layer) / r (look-ahead's reads hidden in attention) or b / w (PILOT's busy share of attention / waste per read), calibration | disk GB/s: fit / replay raw "
      "| look-ahead coverage: projection / replay | min context: projection / replay |")
print("|---|---:|---|---:|---|---:|---|---|---|---|---|")
ratios = []
budgets = sorted({b for b, _ in arms}, key=lambda b: float(b.rstrip("MG")) * (1024 if b.endswith("G") else 1))
for b in budgets:
    for pf in ("off", "lookahead", "pilot", "mtp"):
        runs = arms.get((b, pf))
        if not runs:
            continue
        f = fit(b, {"mtp": "lookahead"}.get(pf, pf))
        key = "mtp_on" if pf == "mtp" else "mtp_off"
        each = [r["decode_tok_s"] for r in runs]
        meas = statistics.median(each)
        run = runs[0]
        raw = [x for r in runs for x in (r["raw_gb_s"]["before"], r["raw_gb_s"]["after"])]
        lc = run.get("lookahead_control") or {}
        hit = statistics.median(r["hit_rate"] for r in runs)
        cov = statistics.median(r["prefetch_coverage"] for r in runs)
        if f:
            p, mach = f["projection"], f["machine"]
            proj = p["decode_tok_s"][key]
            ratios.append(proj / meas)
            cells = (f"{proj:.2f}", f"**{proj / meas:.2f}**", f"{p['hit_rate'][key]:.3f}",
                     f"{mach['moe_overlap']:.2f} / {mach['layer_overhead_ms']:.2f}"
                     + (f" / r {mach['lookahead_hidden']:.2f}" if pf in ("lookahead", "mtp") and "lookahead_hidden" in mach else "")
                     + (f" / b {mach['pilot_busy']:.2f} / w {mach['pilot_waste']:.3f}" if pf == "pilot" else ""), f"{mach['disk_gbps']:.2f}",
                     f"{p['prefetch']['coverage']:.2f}", f"{p['prefetch'].get('min_context') or '–'}")
        else:
            cells = ("–", "–", "–", "–", "–", "–", "–")
        print(f"| {b} | {run['lru_slots_per_layer']} | {pf if pf != 'mtp' else 'MTP on, look-ahead'} | {cells[0]} "
              f"| {meas:.2f} ({', '.join(f'{x:.2f}' for x in each)}) | {cells[1]} "
              f"| {cells[2]} / {hit:.3f} | {cells[3]} | {cells[4]} / {min(raw):.2f}–{max(raw):.2f} "
              f"| {cells[5]} / {cov:.2f} | {cells[6]} / {lc.get('min_context', '–')} |")
    for ahead in ("lookahead", "pilot"):
        gain(b, ahead)
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
        f = fit(b, "off")
        proj = f and f["projection"]["prefill_tok_s"].get(str(n))
        if proj is None:
            continue
        print(f"| {b} | {n} | {proj:.2f} | {run['prefill_tok_s']:.2f} | **{proj / run['prefill_tok_s']:.2f}** "
              f"| {run['read_ratio_to_touched']:.2f} |")
