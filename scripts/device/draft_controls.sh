#!/usr/bin/env bash
# One device call on two GPUs of one host: the two draft controls at h200 scale, each on its own GPU, packed into
# $OUT/controls.tgz (sweep.json, sft.json, profiles, logs; no weights). Runs in the repository root.
#   GPU 0, frozen: fig4's drafted rows from one SFT warm start, drafts co-trained (draft.loss_weight 1) and frozen
#     (0): does co-training itself raise acceptance length when the policy moves?
#   GPU 1, off-domain: the same rows with drafts warm-started on the math workload (scripts/experiments/
#     draft_offdomain.sh): do co-trained drafts adapt to a workload they were not trained on?
# KEY/VALUES vary another draft setting over both warm starts instead (ROWS: which fig4 rows), e.g. the lr sweep:
#   REPRO_GIT_SHA=<sha> [BUDGET_S=480] [ROWS=...] [KEY=loss_weight VALUES=0,1] bash scripts/device/draft_controls.sh
#   KEY=lr VALUES=5e-5,1.5e-4,5e-4 ROWS=DFlash,DSpark bash scripts/device/draft_controls.sh      (the folders stay
#   named frozen/ and offdomain/: in-domain and off-domain warm start)
# (a dry run on a CPU: OUT=/tmp/o PROFILE=cpu-tiny STEPS=2 PY=.venv/bin/python bash scripts/device/draft_controls.sh)
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
BUDGET=${BUDGET_S:-480}
export W=/tmp/draft_controls PY=${PY:-python3} PROFILE=${PROFILE:-h200} STEPS=${STEPS:-0}
export ROWS=${ROWS:-EAGLE-3,DFlash,DSpark} KEY=${KEY:-loss_weight} VALUES=${VALUES:-0,1}
rm -rf "$W"; mkdir -p "$W/frozen" "$W/offdomain"
log() { echo "[$(date +%T)] $*"; }
frozen() {
  "$PY" -m repro.rl.sft --profile "$PROFILE" --policy dense --workload workplace --drafts eagle3,dflash,dspark \
    --out "$W/frozen/sft" > "$W/frozen/sft.log" 2>&1 || return $?
  "$PY" -m repro.rl.draft_sweep --profile "$PROFILE" --artifact fig4 --rows "$ROWS" \
    --key "$KEY" --values "$VALUES" --warm-start "$W/frozen/sft" --steps "$STEPS" --jobs 2 --out "$W/frozen"
}
export -f frozen
log "frozen control on GPU 0, off-domain on GPU 1 (budget ${BUDGET}s each)"
CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$BUDGET" bash -c frozen > "$W/frozen/session.log" 2>&1 &
p0=$!
CUDA_VISIBLE_DEVICES=1 OUT=$W/offdomain timeout -k 10 "$BUDGET" \
  bash scripts/experiments/draft_offdomain.sh > "$W/offdomain/session.log" 2>&1 &
p1=$!
wait $p0; log "frozen rc=$?"; wait $p1; log "offdomain rc=$?"
(cd "$W" && find . -type f \( -name '*.json' -o -name '*.log' -o -name '*.yaml' \) ! -path '*/checkpoints/*' -print0 \
   | tar czf "$OUT/controls.tgz" --null -T -) && log "packed $(du -h "$OUT/controls.tgz" | cut -f1)"
tail -n 3 "$W/frozen/session.log" "$W/offdomain/session.log"
