#!/usr/bin/env bash
# One H200 device call (session 5, call 3): the block drafts' update overhead interleaved with a no-draft update
# over many rounds (repro.bench.step_breakdown's update_ab), then Figure 3's baseline with its seed replicas
# (gpu_rl --artifact fig3 --rows "no draft" --seed-replicas-only: seeds 1 and 2, 20 steps as session 4's rows). GPU clocks, power and throttle reasons are logged
# every 0.5 s beside them (clocks.csv). Packed into $OUT/call3.tgz.
#   REPRO_GIT_SHA=<sha> bash scripts/device/seeds_and_ab.sh [RL_BUDGET_S]
set -uo pipefail
BUDGET=${1:-300}
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
W=$OUT/work; mkdir -p "$W"
log() { echo "[$(date +%T)] $*"; }
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 500 > "$W/clocks.csv" 2>&1 &
SMI=$!
for row in DSpark DFlash; do
  log "step_breakdown $row"
  timeout 100 python3 -m repro.bench.step_breakdown --profile h200 --rows "Qwen3-8B/$row" --warmup 2 --repeats 12 \
    --out "$W/sb_$row" > "$W/sb_$row.log" 2>&1
  log "step_breakdown $row rc=$?"
  grep -E "interleaved" "$W/sb_$row.log" | tail -1
done
rm -rf "$W"/sb_*/runs "$W"/sb_*/tokenizer
log "gpu_rl fig3 baseline seeds (budget ${BUDGET}s)"
timeout $((BUDGET + 120)) python3 -m repro.bench.gpu_rl --out "$W/rl" --artifact fig3 --steps 20 --rows "no draft" --seed-replicas-only \
  --budget-s "$BUDGET" > "$W/gpu_rl.log" 2>&1
log "gpu_rl rc=$?"
kill $SMI 2>/dev/null
(cd "$W" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.yaml' -o -name '*.csv' \) \
   ! -path '*/checkpoints/*' -print0 | tar czf "$OUT/call3.tgz" --null -T -) && log "packed $(du -h "$OUT/call3.tgz" | cut -f1)"
tail -4 "$W/gpu_rl.log"
