#!/usr/bin/env bash
# `nectar fit --project` against `nectar bench replay` on the very same routes, at three budgets,
# look-ahead off and on, then prefill (benchmarks/RESULTS.md, "The projection validated on a
# quiet machine"). Run it on a quiet machine; tabulate with projection_validation.py O TAG.
#
#   nectar synth --layers 4 --out S4                                   # 20.25 GiB
#   python3 benchmarks/trace_subset.py tests/fixtures/traces/route256 SUB4 0,6,12,18
#   N=target/release/nectar M=S4 T=SUB4 O=OUT TAG=Q benchmarks/projection_validation.sh
set -uo pipefail
N=${N:?the nectar binary}; M=${M:?the synth container}; T=${T:?the trace subset}; O=${O:?output dir}; TAG=${TAG:-Q}
mkdir -p "$O"
log() { echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) $*" | tee -a $O/log$TAG; }
for b in 2100M 2950M 4250M; do
  for pf in off lookahead; do
    log "fit $b $pf"
    $N fit --model $M --memory-budget $b --project --prefetch $pf --trace $T --json > $O/fit$TAG-$b-$pf.json 2> $O/fit$TAG-$b-$pf.err
  done
  log "replay $b"
  $N bench replay --model $M --memory-budget $b --trace $T --conversations 4 --tokens 256 --raw-seconds 1 \
     --prefetch off,lookahead --json > $O/replay$TAG-$b.json 2> $O/replay$TAG-$b.err
done
log "prefill"
$N bench replay --model $M --memory-budget 2100M --prompt-rows 512,2048 --json > $O/prefill$TAG.json 2> $O/prefill$TAG.err
log done
