#!/usr/bin/env bash
# `auto` vs `off` on long-lived servers: per --parallel level one `off` and one `auto` server
# stay up for ROUNDS load rounds each (scripts/load.py, clients = parallel), alternating (the
# order rotates every round), so `auto`'s controller is measured past its first windows. Prints
# one JSON line per round and arm: tok/s, and for `auto` the drafts of that round and the
# controller's choices per step shape after it; `busy_seconds` is the server's model time so
# far (its delta per round is less sensitive to the load generator than wall time).
# With REF_BIN, a third server runs REF_BIN's `auto` (arm `auto_ref`) in the same rounds: a
# before/after comparison on the same machine at the same load. PORT (default 18700) moves
# the servers' ports.
#   benchmarks/mtp_longlived.sh [NECTAR_BIN] [ROUNDS] [REQUESTS_PER_CLIENT] [MAX_TOKENS] [LEVELS] [REF_BIN]
set -euo pipefail
bin=${1:-target/release/nectar}
rounds=${2:-12}
requests=${3:-4}
max_tokens=${4:-48}
levels=${5:-"1 4 8"}
ref=${6:-}
base=${PORT:-18700}
arms=(off auto); [ -n "$ref" ] && arms+=(auto_ref)
echo "# $(uname -m) $(nproc) cores; $(uptime)"
stats='import json,sys,urllib.request as u
s=json.load(u.urlopen(sys.argv[1]+"/stats"))
m=s["mtp"]
print(json.dumps({"drafted":m.get("drafted",0),"accepted":m.get("accepted",0),
  "choices":[(c["rows"],c["auto_rows"],c["gamma"]) for c in (m.get("auto") or {}).get("choices",[])],
  "steps":s["batch"].get("steps"),"busy_seconds":s["tokens"]["busy_seconds"]}))'
port_of() { # arm -> port
  local i
  for i in "${!arms[@]}"; do [ "${arms[$i]}" != "$1" ] || echo $((base + p * 4 + i)); done
}
for p in $levels; do
  pids=()
  for m in "${arms[@]}"; do
    b=$bin; mode=$m
    if [ "$m" = auto_ref ]; then b=$ref; mode=auto; fi
    "$b" serve --port "$(port_of "$m")" --parallel "$p" --mtp "$mode" --alias nectar \
      2>"/tmp/mtp_longlived_${base}_$m.log" &
    pids+=($!)
  done
  trap 'kill "${pids[@]}" 2>/dev/null' EXIT
  for m in "${arms[@]}"; do
    for _ in $(seq 1 600); do grep -q " ready" "/tmp/mtp_longlived_${base}_$m.log" && break; sleep 0.1; done
  done
  for r in $(seq 1 "$rounds"); do
    n=${#arms[@]}; order=()
    for k in $(seq 0 $((n - 1))); do order+=("${arms[$(((r + k) % n))]}"); done
    (( r % 2 )) || order=($(printf '%s\n' "${order[@]}" | tac))
    for m in "${order[@]}"; do
      port=$(port_of "$m")
      out=$(python3 scripts/load.py --base-url "http://127.0.0.1:$port" --clients "$p" \
        --requests "$requests" --max-tokens "$max_tokens" --json)
      st=$(python3 -c "$stats" "http://127.0.0.1:$port")
      echo "{\"parallel\":$p,\"round\":$r,\"mtp\":\"$m\",\"load\":$out,\"stats\":$st}"
    done
  done
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
done
echo "# $(uptime)"
