#!/usr/bin/env bash
# One H200 device call (session 4, call 1): where the 256K TTT trunk loses to SDPA, the TTT run with the
# fastest memory-bounded route, and the step breakdown (kernel profiles) of the block drafts' update.
# Runs in the repository root on the device; writes under $OUT (tarred: the device returns <= 8 files).
#   REPRO_GIT_SHA=<sha> bash scripts/device/attention_and_breakdown.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
W=$OUT/work; mkdir -p "$W"
log() { echo "[$(date +%T)] $*"; }

log "A/B: one causal pass at 256K per route, and SDPA's cuDNN kernel"
timeout 200 python3 -m repro.bench.gpu_attention --out "$W/ab" --skip-checks --only pass,sdpa --sizes 256K \
  --sdpa-kernels cudnn --budget-s 170 \
  --pass-routes "cudnn,cudnn-rep,tiled[cudnn]@16384/16384,tiled[cudnn]@16384/0,tiled[cudnn]@32768/0,tiled[cudnn-rep]@16384/0" \
  > "$W/ab.log" 2>&1
log "A/B rc=$?"
ROUTE=$(python3 - "$W/ab/fig6/bench.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
best = min((r for r in recs if r["row"].split()[0] == "pass" and "tiled[" in r["params"].get("route", "")
                          and "time_s" in r.get("metrics", {})), key=lambda r: r["metrics"]["time_s"], default=None)
print(best["params"]["route"] if best else "tiled[cudnn]@16384/16384")
PY
)
log "TTT 256K with route $ROUTE (checks first)"
timeout 220 python3 -m repro.bench.gpu_attention --out "$W/ttt" --only ttt --sizes 256K --ttt-backend "$ROUTE" \
  --budget-s 200 > "$W/ttt.log" 2>&1
log "TTT rc=$?"

for row in DFlash DSpark; do
  log "step_breakdown $row"
  timeout 150 python3 -m repro.bench.step_breakdown --profile h200 --rows "Qwen3-8B/$row" --warmup 2 --repeats 3 \
    --out "$W/sb_$row" > "$W/sb_$row.log" 2>&1
  log "step_breakdown $row rc=$?"
done
rm -rf "$W"/sb_*/runs "$W"/sb_*/tokenizer
tar czf "$OUT/call1.tgz" -C "$W" . && log "packed $(du -h "$OUT/call1.tgz" | cut -f1)"
