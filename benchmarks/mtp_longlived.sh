#!/usr/bin/env bash
# `auto` vs `off` on long-lived servers: per --parallel level one `off` and one `auto` server
# stay up for ROUNDS load rounds each (scripts/load.py, clients = parallel), alternating (the
# order flips every round), so `auto`'s controller is measured past its first windows. Prints
# one JSON line per round and arm: tok/s, and for `auto` the drafts of that round and the
# controller's choices per step shape after it.
#   benchmarks/mtp_longlived.sh [NECTAR_BIN] [ROUNDS] [REQUESTS_PER_CLIENT] [MAX_TOKENS] [LEVELS]
set -euo pipefail
bin=${1:-target/release/nectar}
rounds=${2:-12}
requests=${3:-4}
max_tokens=${4:-48}
levels=${5:-"1 4 8"}
echo "# $(uname -m) $(nproc) cores; $(uptime)"
stats='import json,sys,urllib.request as u
s=json.load(u.urlopen(sys.argv[1]+"/stats"))
m=s["mtp"]
print(json.dumps({"drafted":m.get("drafted",0),"accepted":m.get("accepted",0),
  "choices":[(c["rows"],c["auto_rows"],c["gamma"]) for c in (m.get("auto") or {}).get("choices",[])],
  "steps":s["batch"].get("steps")}))'
for p in $levels; do
  pids=()
  for m in off auto; do
    port=$((18700 + p * 2)); [ "$m" = auto ] && port=$((port + 1))
    "$bin" serve --port "$port" --parallel "$p" --mtp "$m" --alias nectar 2>"/tmp/mtp_longlived_$m.log" &
    pids+=($!)
  done
  trap 'kill "${pids[@]}" 2>/dev/null' EXIT
  for m in off auto; do
    for _ in $(seq 1 600); do grep -q " ready" "/tmp/mtp_longlived_$m.log" && break; sleep 0.1; done
  done
  for r in $(seq 1 "$rounds"); do
    if (( r % 2 )); then arms="off auto"; else arms="auto off"; fi
    for m in $arms; do
      port=$((18700 + p * 2)); [ "$m" = auto ] && port=$((port + 1))
      out=$(python3 scripts/load.py --base-url "http://127.0.0.1:$port" --clients "$p" \
        --requests "$requests" --max-tokens "$max_tokens" --json)
      st=$(python3 -c "$stats" "http://127.0.0.1:$port")
      echo "{\"parallel\":$p,\"round\":$r,\"mtp\":\"$m\",\"load\":$out,\"stats\":$st}"
    done
  done
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
done
echo "# $(uptime)"
