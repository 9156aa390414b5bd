#!/usr/bin/env python3
"""GLM-5.2's decode projected on the machines of benchmarks/RESULTS.md, as one table.

Deterministic: every speed is a flag (`nectar fit --geometry ... --project`), so two binaries
give the same figures unless the plan or the projection changed. The calibrated constants are
the RESULTS ones: the MoE block 0.76 hidden behind reads (eta), look-ahead r 0.17 / c 0.96,
PILOT b 1.00 / w 0.071, both (look-ahead and PILOT) b 0.99 / w 0.078, CPU kernels at 0.6 of
the memory bandwidth, 1000 GFLOP/s prefill.

    python3 benchmarks/glm52_machines.py [NECTAR_BINARY]   # default target/release/nectar
    python3 benchmarks/glm52_machines.py [NECTAR_BINARY] --parallel   # serve --parallel 2 / 4

`--parallel` prints a second table instead: `nectar serve --parallel N` at full load (N
conversations decoded together, planned as `fit --serve` plans them; look-ahead, MTP off).
"""
import json
import subprocess
import sys

ARGS = [a for a in sys.argv[1:] if a != "--parallel"]
NECTAR = ARGS[0] if ARGS else "target/release/nectar"
PARALLEL = "--parallel" in sys.argv[1:]
COMMON = "--project --kernel-share 0.6 --gflops 1000 --moe-overlap 0.76 --json".split()
CARD = "--gpu-memory 21G --gpu-gbps 350 --gpu-product-us 30 --gpu-copy-gbps 25".split()
MACHINES = [
    ("32 GB + PCIe4 (7 GB/s), DDR5 65 GB/s, 8 cores",
     "--memory-budget 29G --disk-gbps 7 --mem-gbps 65 --cores 8 --layer-overhead-ms 1.0".split()),
    ("64 GB + PCIe5 (14 GB/s), DDR5 65 GB/s, 8 cores",
     "--memory-budget 61G --disk-gbps 14 --mem-gbps 65 --cores 8 --layer-overhead-ms 1.0".split()),
    ("128 GB unified, 400 GB/s, 7 GB/s SSD, 12 cores",
     "--memory-budget 122G --disk-gbps 7 --mem-gbps 400 --cores 12 --layer-overhead-ms 0.67".split()),
    ("64 GB + PCIe4 + a 24 GB card",
     "--memory-budget 61G --disk-gbps 7 --mem-gbps 65 --cores 8 --layer-overhead-ms 1.0".split() + CARD),
    ("32 GB + PCIe4 + a 24 GB card",
     "--memory-budget 29G --disk-gbps 7 --mem-gbps 65 --cores 8 --layer-overhead-ms 1.0".split() + CARD),
]
PREFETCH = {
    "off": ["--prefetch", "off"],
    "lookahead": "--prefetch lookahead --lookahead-hidden 0.17 --lookahead-cancelled 0.96".split(),
    "pilot": "--prefetch pilot --pilot-busy 1.0 --pilot-waste 0.071".split(),
    "both": "--prefetch both --pilot-busy 0.99 --pilot-waste 0.078".split(),
}


def project(geometry, flags, prefetch, extra=()):
    cmd = [NECTAR, "fit", "--geometry", geometry] + COMMON + flags + PREFETCH[prefetch] + list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["projection"]


def slots(p):
    c, x = p["lru_slots_per_layer"], p.get("lru_extra_slot_share", {}).get("mtp_off", 0.0)
    return f"{c}" if not x else f"{c}–{c + 1} ({c + 1} on {100 * x:.0f} %)"


def parallel_table():
    # slots/layer: the full plan's (N rows decoding); a lone client of the same server decodes
    # with the idle rows' memory lent to its cache (its slots and tok/s in the last columns).
    print("| machine | geometry | sequences | slots/layer | hit | experts a layer a step | GB/token from disk | tok/s in all | per sequence | a lone client: slots, tok/s | ÷ a lone client |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for name, flags in MACHINES:
        if "--gpu-memory" in flags:
            continue
        for geometry in ("glm52-row", "glm52"):
            for n in (2, 4):
                p = project(geometry, flags, "lookahead", ["--serve", "--parallel", str(n)])
                b = p["parallel"]
                print(f"| {name} | {'per row' if geometry == 'glm52-row' else 'g64'} | {n} "
                      f"| {b['lru_slots_per_layer']} | {b['hit_rate']:.3f} | {b['unique_experts_per_layer']:.1f} "
                      f"| {b['ssd_gb_per_token']:.2f} | {b['decode_tok_s']:.2f} "
                      f"| {b['decode_tok_s_per_sequence']:.2f} | {slots(p)}, {p['decode_tok_s']['mtp_off']:.2f} "
                      f"| {b['gain_over_one_sequence']:.2f} |")
                name = ""


if PARALLEL:
    parallel_table()
    sys.exit(0)

print("| machine | geometry | slots/layer | hit | off | look-ahead | PILOT | both | overlap ceiling (one row a forward: the bound of off / look-ahead / PILOT / both) | MTP on (look-ahead; 1.686 tokens a forward) | MTP on's overlap ceiling |")
print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for name, flags in MACHINES:
    for geometry in ("glm52-row", "glm52"):
        runs = {k: project(geometry, flags, k) for k in PREFETCH}
        la = runs["lookahead"]
        tok = {k: v["decode_tok_s"]["mtp_off"] for k, v in runs.items()}
        pilot_slots = "" if runs["pilot"]["lru_slots_per_layer"] == la["lru_slots_per_layer"] \
            else f"; PILOT {slots(runs['pilot'])}"
        print(f"| {name} | {'per row' if geometry == 'glm52-row' else 'g64'} "
              f"| {slots(la)}{pilot_slots} | {la['hit_rate']['mtp_off']:.3f} "
              f"| {tok['off']:.2f} | {tok['lookahead']:.2f} | {tok['pilot']:.2f} | {tok['both']:.2f} "
              f"| {la['overlap_ceiling_tok_s']:.2f} | {la['decode_tok_s']['mtp_on']:.2f} "
              f"| {la['overlap_ceiling_tok_s_mtp_on']:.2f} |")
        name = ""
