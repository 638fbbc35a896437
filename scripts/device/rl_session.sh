#!/usr/bin/env bash
# One H200 device call of RL work: an optional CUDA-graph smoke check, then one RL artifact's rows end to end
# (repro.bench.gpu_rl), packed into $OUT/rl.tgz (the device returns <= 8 files). Runs in the repository root.
#   REPRO_GIT_SHA=<sha> bash scripts/device/rl_session.sh ARTIFACT BUDGET_S [GRAPH_CHECK=0|1] [extra gpu_rl args...]
#   e.g. bash scripts/device/rl_session.sh table1 430 1 --policies dense
set -uo pipefail
ART=${1:?artifact}; BUDGET=${2:?budget seconds}; CHECK=${3:-0}; shift 3 || shift $#
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
W=$OUT/work; mkdir -p "$W"
log() { echo "[$(date +%T)] $*"; }
if [ "$CHECK" = 1 ]; then
  log "graph_check"
  timeout 120 python3 -m repro.rollout.graph_check --out "$W/graph" --profile h200 > "$W/graph_check.log" 2>&1
  log "graph_check rc=$?"
fi
log "gpu_rl $ART (budget ${BUDGET}s) $*"
# .cache/sft (or $SFT_CACHE; ignored by git) survives while the machine stays warm: a next call within the idle window reuses the SFT
# --deadline-s: a row that would not finish before the timeout (its expected time: the same row earlier in this call)
# is skipped rather than cut; 20 s of the timeout are left for startup and the summary
timeout $((BUDGET + 140)) python3 -m repro.bench.gpu_rl --out "$W/rl" --artifact "$ART" --budget-s "$BUDGET" \
  --deadline-s $((BUDGET + 120)) \
  --sft-cache "${SFT_CACHE:-.cache/sft}" "$@" \
  > "$W/gpu_rl.log" 2>&1
log "gpu_rl rc=$?"
# pack what exists even when gpu_rl was cut short (its own tarball is written only at its end)
(cd "$W" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.yaml' \) \
   ! -path '*/checkpoints/*' -print0 | tar czf "$OUT/rl.tgz" --null -T -) && log "packed $(du -h "$OUT/rl.tgz" | cut -f1)"
tail -5 "$W/gpu_rl.log"
