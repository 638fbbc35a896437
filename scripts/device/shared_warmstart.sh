#!/usr/bin/env bash
# One device call: several draft sweeps (repro.rl.draft_sweep) of fig4's rows from ONE in-domain SFT warm start,
# spread over the GPUs, so that their acceptance lengths compare without the warm start's own variation (on a GPU the
# block drafts' offline training is not bit-reproducible: DFlash's step-0 AL was 3.754 and 3.888 from two SFTs of
# unchanged code, results/1xh200/h200/determinism/). Each ARM is GPU:KEY=VALUES; arms on one GPU run one after
# another, GPUs in parallel.
# Packed into $OUT/arms.tgz (sweep.json per arm, sft.json, logs; no weights). Runs in the repository root.
#   REPRO_GIT_SHA=<sha> [ROWS=DFlash,DSpark] [BUDGET_S=480] bash scripts/device/shared_warmstart.sh \
#     "0:loss_weight=0" "0:lr=5e-5" "1:lr=1.5e-4" "1:lr=5e-4"
# (a dry run on a CPU: OUT=/tmp/o PROFILE=cpu-tiny STEPS=2 PY=.venv/bin/python bash scripts/device/shared_warmstart.sh
#   "0:loss_weight=0" "0:lr=1e-3")
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: $0 GPU:KEY=VALUES [GPU:KEY=VALUES ...], e.g. 0:loss_weight=0 1:lr=5e-5" >&2; exit 2; }
for arm in "$@"; do
  [[ $arm =~ ^[0-9]+:[a-z_]+=[0-9eE.,+-]+$ ]] || { echo "bad arm '$arm': expected GPU:KEY=VALUES" >&2; exit 2; }
done
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
BUDGET=${BUDGET_S:-480}
export W=/tmp/shared_warmstart PY=${PY:-python3} PROFILE=${PROFILE:-h200} STEPS=${STEPS:-0} ROWS=${ROWS:-DFlash,DSpark}
rm -rf "$W"; mkdir -p "$W"
log() { echo "[$(date +%T)] $*"; }
drafts=$(echo "$ROWS" | tr ',' '\n' | sed 's/EAGLE-3/eagle3/;s/DFlash/dflash/;s/DSpark/dspark/' | sort -u | paste -sd, -)
log "SFT: workplace policy, drafts $drafts"
"$PY" -m repro.rl.sft --profile "$PROFILE" --policy dense --workload workplace --drafts "$drafts" \
  --out "$W/sft" > "$W/sft.log" 2>&1 || { log "SFT failed"; tail -5 "$W/sft.log"; exit 1; }
gpu_arms() {   # the arms of GPU $1, in order
  local gpu=$1 arm; shift
  for arm in "$@"; do
    [ "${arm%%:*}" = "$gpu" ] || continue
    local kv=${arm#*:} key=${arm#*:}; key=${key%%=*}
    local dir="$W/${kv//[=,]/_}"
    log "GPU $gpu: $kv"
    CUDA_VISIBLE_DEVICES=$gpu "$PY" -m repro.rl.draft_sweep --profile "$PROFILE" --artifact fig4 --rows "$ROWS" \
      --key "$key" --values "${kv#*=}" --warm-start "$W/sft" --steps "$STEPS" --jobs 2 --out "$dir" \
      > "$dir.log" 2>&1
    log "GPU $gpu: $kv rc=$?"
  done
}
export -f log gpu_arms
pids=()
for gpu in $(for arm in "$@"; do echo "${arm%%:*}"; done | sort -u); do
  timeout -k 10 "$BUDGET" bash -c 'gpu_arms "$@"' gpu_arms "$gpu" "$@" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
(cd "$W" && find . -type f \( -name '*.json' -o -name '*.log' \) ! -path '*/checkpoints/*' -print0 \
   | tar czf "$OUT/arms.tgz" --null -T -) && log "packed $(du -h "$OUT/arms.tgz" | cut -f1)"
grep -h "mean AL" "$W"/*.log
