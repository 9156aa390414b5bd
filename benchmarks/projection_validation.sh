#!/usr/bin/env bash
# `nectar fit --project` against `nectar bench replay` on the very same routes, at each budget,
# look-ahead off and on, then (optionally) MTP on and prefill (benchmarks/RESULTS.md, "The
# projection validated …"). Run it on a quiet machine; tabulate with projection_validation.py.
# Each replay arm is its own invocation and the arms alternate (off, lookahead, lookahead, off,
# … for ROUNDS rounds), so a drift in the machine's speed falls on both arms and what finished
# before a time limit is kept.
#
#   nectar synth --layers 4 [--mtp] --out S4                          # 20.25 GiB (+ 9.7 with --mtp)
#   python3 benchmarks/trace_subset.py tests/fixtures/traces/route256 SUB4 0,6,12,18 [TOKENS]
#   N=target/release/nectar M=S4 T=SUB4 O=OUT TAG=Q [TOKENS=256 ROUNDS=2 BUDGETS="2100M 2950M 4250M"
#     MTP_BUDGETS="2100M" PREFILL=1 DEADLINE=EPOCH_SECONDS FITS=before|after ARMS="off lookahead"]
#     benchmarks/projection_validation.sh
#   python3 benchmarks/projection_validation.py OUT Q
#
# TOKENS must be the decode rows each conversation of T holds (trace_subset.py's TOKENS), so that
# the projection's hit-rate curve and the replay see the same rows. MTP_BUDGETS needs a synth
# written with --mtp; a budget in both lists alternates its MTP arm with the other two in every
# round (the table's MTP row needs that budget's look-ahead fit). DEADLINE stops starting new
# steps (a device call's time limit); FITS=after runs the replays first; ARMS picks the prefetch
# arms (replays and fits) of each budget: off, lookahead, pilot (PILOT replays and calibrates on
# the trace model's predictions, the model its manifest names).
set -uo pipefail
N=${N:?the nectar binary}; M=${M:?the synth container}; T=${T:?the trace subset}; O=${O:?output dir}; TAG=${TAG:-Q}
TOKENS=${TOKENS:-256}; ROUNDS=${ROUNDS:-2}; BUDGETS=${BUDGETS:-2100M 2950M 4250M}; MTP_BUDGETS=${MTP_BUDGETS:-}
DEADLINE=${DEADLINE:-0}; ARMS=${ARMS:-off lookahead}
mkdir -p "$O"
log() { echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) $*" | tee -a $O/log$TAG; }
left() {  # seconds before DEADLINE (a day without one); fails when none are left
  local s=86400
  [ "$DEADLINE" -gt 0 ] && s=$((DEADLINE - $(date +%s)))
  [ $s -gt 5 ] && echo $s
}
replay() {  # NAME BUDGET ARGS...
  local name=$1 b=$2 t; shift 2
  t=$(left) || { log "skipped replay $name (deadline)"; return; }
  log "replay $name"
  timeout $t $N bench replay --model $M --memory-budget $b --trace $T --conversations 1000 --tokens $TOKENS \
    --raw-seconds 1 --json "$@" > $O/replay$TAG-$name.json 2> $O/replay$TAG-$name.err
  log "replay $name: exit $?"
}
fits() {  # BUDGET
  for pf in $ARMS; do
    t=$(left) || break
    log "fit $1 $pf"
    timeout $t $N fit --model $M --memory-budget $1 --project --prefetch $pf --trace $T --json > $O/fit$TAG-$1-$pf.json 2> $O/fit$TAG-$1-$pf.err
  done
}
listed() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }  # WORD LIST
for b in $BUDGETS; do
  [ "${FITS:-before}" = before ] && fits $b
  # A budget also in MTP_BUDGETS gets the MTP arm (look-ahead, --mtp on) in every round too:
  # odd rounds run the arms in order, even rounds reversed (off, lookahead, mtp, mtp, …).
  arms=$ARMS; listed $b "$MTP_BUDGETS" && arms="$ARMS mtp"
  for r in $(seq 1 $ROUNDS); do
    order=$arms; [ $((r % 2)) = 0 ] && order=$(echo $arms | tr ' ' '\n' | tac | tr '\n' ' ')
    for a in $order; do
      case $a in
        mtp) replay $b-mtp-$r $b --prefetch lookahead --mtp on ;;
        *) replay $b-$a-$r $b --prefetch $a ;;
      esac
    done
  done
  [ "${FITS:-before}" = after ] && fits $b
done
for b in $MTP_BUDGETS; do  # MTP budgets without fits or off / look-ahead arms: one run each
  listed $b "$BUDGETS" || replay $b-mtp-1 $b --prefetch lookahead --mtp on
done
if [ -n "${PREFILL:-}" ]; then
  b=${BUDGETS%% *}
  t=$(left) && { log "prefill"; timeout $t $N bench replay --model $M --memory-budget $b --prompt-rows 512,2048 --json > $O/prefill$TAG.json 2> $O/prefill$TAG.err; }
fi
log done
