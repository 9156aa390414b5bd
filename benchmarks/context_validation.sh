#!/usr/bin/env bash
# Validates `nectar fit --project --context N` — the attention a decoded row pays at N tokens of
# context beyond a short one — against `nectar run`: decode seconds per token after an N-token
# prompt less the same after a 32-token prompt in the same round, on one container with every weight in RAM (so
# the difference is the context's work alone), arms alternated in each round. Prints one line
# per context: the measured difference (median over rounds, each against its own round), the projected one (median over the
# rounds' fits) and their ratio. RESULTS.md records its runs.
#
#   benchmarks/context_validation.sh MODEL [CONTEXTS] [ROUNDS] [TOKENS]
#   e.g. nectar synth --layers 2 --experts 32 --out /tmp/s2   # GLM-5.2's attention geometry
#        benchmarks/context_validation.sh /tmp/s2 "4096 8192" 3 33
#
# NECTAR (default: target/release/nectar) is the binary; RUN_ARGS are added to each `nectar run`
# (`--gpu-memory off` with a CUDA build, which would otherwise put the attention on the GPU);
# logs go to OUT (default a temp dir).
set -euo pipefail
model=${1:?usage: context_validation.sh MODEL [CONTEXTS] [ROUNDS] [TOKENS]}
contexts=${2:-"4096 8192"}
rounds=${3:-3}
tokens=${4:-33}
nectar=${NECTAR:-target/release/nectar}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
log="$OUT/context.jsonl"
: >"$log"
ids() { python3 -c "import random; r = random.Random($1); print(','.join(str(r.randrange(4096)) for _ in range($1)))"; }
run() {  # N ROUND
  "$nectar" run --model "$model" --prompt-ids "$(ids "$1")" --max-tokens "$tokens" \
    --ctx-size $(($1 + tokens + 16)) --no-usage-save --json ${RUN_ARGS:-} 2>>"$OUT/run.err" |
    python3 -c 'import json, sys; j = json.load(sys.stdin)["stats"]
print(json.dumps({"arm": "run", "n": int(sys.argv[1]), "round": int(sys.argv[2]), "s_per_token": 1 / j["decode_tok_s"]}))' "$1" "$2" >>"$log"
}
fit() {  # N (the context term needs no calibration: --layer-overhead-ms / --moe-overlap skip it)
  "$nectar" fit --model "$model" --project --context "$1" --layer-overhead-ms 1 \
    --moe-overlap 0 --json 2>>"$OUT/fit.err" |
    python3 -c 'import json, sys; c = json.load(sys.stdin)["projection"]["context"]
print(json.dumps({"arm": "fit", "n": int(sys.argv[1]), "s_per_row": c["attention_ms_per_row"] / 1e3}))' "$1" >>"$log"
}
for r in $(seq 1 "$rounds"); do
  order="32 $contexts"
  [ $((r % 2)) = 0 ] && order="$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')"
  for n in $order; do run "$n" "$r"; done
  for n in $contexts; do fit "$n"; done
done
python3 - "$log" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
run = {(r["n"], r["round"]): r["s_per_token"] for r in rows if r["arm"] == "run"}
rounds = sorted({k[1] for k in run})
for n in sorted({r["n"] for r in rows if r["arm"] == "fit"}):
    # Each round's difference against its own short-context run: the machine's drift between
    # rounds cancels.
    diffs = [run[(n, r)] - run[(32, r)] for r in rounds if (n, r) in run and (32, r) in run]
    meas = statistics.median(diffs)
    proj = statistics.median(r["s_per_row"] for r in rows if r["arm"] == "fit" and r["n"] == n)
    print(f"context {n}: measured +{meas * 1e3:.2f} ms/token (rounds: {', '.join(f'{d * 1e3:.1f}' for d in diffs)}), "
          f"projected +{proj * 1e3:.2f}, projected / measured {proj / meas:.2f}")
print(f"(after 32 tokens: {statistics.median(run[(32, r)] for r in rounds) * 1e3:.2f} ms/token)")
EOF
echo "logs: $OUT"
