#!/usr/bin/env bash
# One H200 device call (session 5, call 1): the graphed block-draft training step checked against the eager one
# (repro.rl.draft_graph), then the update overhead of DFlash and DSpark interleaved with a no-draft update in one
# process, graphed and eager (repro.bench.step_breakdown's update_ab). Packed into $OUT/call1.tgz.
#   REPRO_GIT_SHA=<sha> bash scripts/device/draft_graph_session.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
W=$OUT/work; mkdir -p "$W"
log() { echo "[$(date +%T)] $*"; }
log "draft_graph check"
timeout 150 python3 -m repro.rl.draft_graph --out "$W/draft_graph" --profile h200 > "$W/draft_graph.log" 2>&1
log "draft_graph rc=$?"
tail -4 "$W/draft_graph.log"
for row in DSpark DFlash; do
  log "step_breakdown $row"
  timeout 170 python3 -m repro.bench.step_breakdown --profile h200 --rows "Qwen3-8B/$row" --warmup 2 --repeats 6 \
    --out "$W/sb_$row" > "$W/sb_$row.log" 2>&1
  log "step_breakdown $row rc=$?"
  grep -E "update|rollout" "$W/sb_$row.log" | tail -4
done
rm -rf "$W"/sb_*/runs "$W"/sb_*/tokenizer
tar czf "$OUT/call1.tgz" -C "$W" . && log "packed $(du -h "$OUT/call1.tgz" | cut -f1)"
