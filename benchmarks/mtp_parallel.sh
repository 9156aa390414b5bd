#!/usr/bin/env bash
# `nectar serve` at --parallel 1, 4, 8 × --mtp off/on/auto on the demo model: aggregate tok/s and
# p50/p99 latency (scripts/load.py, clients = parallel). Arms alternate within each round and
# the order rotates between rounds, so drift on a shared machine spreads over all arms.
#   benchmarks/mtp_parallel.sh [NECTAR_BIN] [ROUNDS] [REQUESTS_PER_CLIENT] [MAX_TOKENS]
set -euo pipefail
bin=${1:-target/release/nectar}
rounds=${2:-2}
requests=${3:-4}
max_tokens=${4:-64}
port=18611
echo "# $(uname -m) $(nproc) cores; $(uptime)"
for r in $(seq 1 "$rounds"); do
  for p in 1 4 8; do
    case $(( (r + p) % 3 )) in
      0) arms="off on auto" ;; 1) arms="on auto off" ;; *) arms="auto off on" ;;
    esac
    for m in $arms; do
      "$bin" serve --port "$port" --parallel "$p" --mtp "$m" --alias nectar 2>/tmp/mtp_parallel_serve.log &
      pid=$!
      trap "kill $pid 2>/dev/null" EXIT
      for _ in $(seq 1 600); do
        grep -q " ready" /tmp/mtp_parallel_serve.log 2>/dev/null && break
        sleep 0.1
      done
      out=$(python3 scripts/load.py --base-url "http://127.0.0.1:$port" --clients "$p" \
        --requests "$requests" --max-tokens "$max_tokens" --json)
      stats=$(python3 -c 'import json,sys,urllib.request as u; s=json.load(u.urlopen(sys.argv[1]+"/stats")); print(json.dumps({"batch":s["batch"],"mtp":s["mtp"]}))' "http://127.0.0.1:$port")
      kill "$pid"; wait "$pid" 2>/dev/null || true
      echo "{\"round\":$r,\"parallel\":$p,\"mtp\":\"$m\",\"load\":$out,\"stats\":$stats}"
    done
  done
done
echo "# $(uptime)"
