#!/usr/bin/env bash
# One device call (nvidia-h200): does fig4 with rl.rollout.bucket_batch (the h200 profile's setting since session 14)
# stop capturing new draft graphs, and does it reproduce the committed fig4 runs, which ran without it? Builds the
# workplace SFT warm start, then fig4's four rows in lockstep (repro.bench.gpu_rl) for STEPS steps, without the
# baseline's seed replicas (--seeds none). Compare the rows' train/reward and train/graph_captures per step with
# results/1xh200/h200/fig4/<row>/metrics.jsonl afterwards. Writes only
# $OUT/fig4_bucket.tgz (gpu_rl's json/jsonl/log/yaml files, never checkpoints); work files in .cache/fig4_bucket.
#   REPRO_GIT_SHA=<sha> [STEPS=15] [TIMEOUT_S=420] bash scripts/device/fig4_bucket_check.sh
#   OUT=/tmp/o PY=.venv/bin/python PROFILE=cpu-tiny STEPS=2 SFT_STEPS=3 \
#     bash scripts/device/fig4_bucket_check.sh                                                       # CPU dry run
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
PY=${PY:-python3}; : "${OUT:?set OUT}"; W=.cache/fig4_bucket; rm -rf "$W"; mkdir -p "$W" "$OUT"
log() { echo "[$(date +%T)] $*"; }
log "fig4, ${STEPS:-15} steps, lockstep, from its SFT warm start"
timeout "${TIMEOUT_S:-420}" "$PY" -m repro.bench.gpu_rl --out "$W/rl" --profile "${PROFILE:-h200}" --artifact fig4 \
  --seeds none --steps "${STEPS:-15}" --sft-cache .cache/sft_fig4 ${SFT_STEPS:+--sft-steps $SFT_STEPS} \
  > "$W/gpu_rl.log" 2>&1
log "gpu_rl rc=$?"
(cd "$W" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.yaml' \) \
   ! -path '*/checkpoints/*' ! -path '*/ckpt/*' -print0 | tar czf "$OUT/fig4_bucket.tgz" --null -T -) \
  && log "packed $(du -h "$OUT/fig4_bucket.tgz" | cut -f1)"
tail -5 "$W/gpu_rl.log"
