#!/usr/bin/env bash
# One device call right after warm_sft.sh "0:fig3" (the math warm start in .cache/sft_job0): the pre-registered h200
# exchangeability study's runs (results/1xh200/h200/exchangeability/PREREGISTRATION.md) and, beside them, the
# co-training checks on this GPU (repro.bench.cotrain_checks: sampled law and update bit-identity in bf16 with the
# draft's CUDA graphs; GPU 0, CHECKS=1). The runs are fig3's drafted ROWS over sampling SEEDS, two at a time, one per
# GPU (scripts/experiments/exchangeability.sh with GPUS=0,1), none started after BUDGET_S; they land in
# .cache/exchangeability_h200, which survives while the machine stays warm, so a second call (CHECKS=0) finishes the
# seeds a first one did not reach. Writes only $OUT/study.tgz (checks JSON and log, each run's env/metrics/run.json
# and log; never the runs' checkpoints, which filled the device's disk when copied); the files are staged in
# .cache/study_pack. Runs in the repository root.
#   REPRO_GIT_SHA=<sha> [ROWS=EAGLE-3,DSpark] [SEEDS=1,2,3,4,5,6] [BUDGET_S=480] [CHECKS=1] bash scripts/device/cotrain_study.sh
# Also: JOBS (runs at a time, default 2, spread over GPUS round-robin), THREADS (torch threads per run, default 0 =
# torch's default), RUNS_TIMEOUT_S (the runs are killed after it, so that the pack still happens inside the call).
#   OUT=/tmp/o PY=.venv/bin/python PROFILE=cpu-tiny WARM=results/cpu-2c/cpu-tiny/sft/dense-math ROWS=EAGLE-3 SEEDS=1 \
#     CHECK_ARGS="--samples 2000" bash scripts/device/cotrain_study.sh                                # CPU dry run
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
PY=${PY:-python3}; : "${OUT:?set OUT}"; W=.cache/study_pack; rm -rf "$W"; mkdir -p "$W" "$OUT"; T0=$(date +%s)
WORK=${WORK:-.cache/exchangeability_h200}
WARM=${WARM:-$(ls -d .cache/sft_job0/dense-math-*/ 2>/dev/null | head -1)}
[ -n "$WARM" ] && [ -f "$WARM/policy.pt" ] || { echo "no math SFT warm start (WARM='$WARM'): run" \
  "scripts/device/warm_sft.sh \"0:fig3\" first, within the machine's idle window" >&2; exit 2; }
log() { echo "[$(date +%T)] $*"; }
cpid=
if [ "${CHECKS:-1}" = 1 ]; then
  log "cotrain_checks on GPU 0"
  # shellcheck disable=SC2086 -- CHECK_ARGS is a word list
  CUDA_VISIBLE_DEVICES=0 timeout 400 "$PY" -m repro.bench.cotrain_checks --out "$W/checks" \
    --profile "${PROFILE:-h200}" ${CHECK_ARGS:-} > "$W/cotrain_checks.log" 2>&1 &
  cpid=$!
fi
log "runs: ${ROWS:-EAGLE-3,DSpark} x seeds ${SEEDS:-1,2,3,4,5,6} from $WARM into $WORK (none started after ${BUDGET_S:-480} s)"
OUT=$W/report WORK=$WORK WARM=$WARM PY=$PY PROFILE=${PROFILE:-h200} ROWS=${ROWS:-EAGLE-3,DSpark} \
  SEEDS=${SEEDS:-1,2,3,4,5,6} JOBS=${JOBS:-2} GPUS=${GPUS:-0,1} THREADS=${THREADS:-0} \
  DEADLINE=$((T0 + ${BUDGET_S:-480})) REPORT=0 \
  timeout "${RUNS_TIMEOUT_S:-86400}" bash scripts/experiments/exchangeability.sh 2>&1 | tee "$W/runs.log"
if [ -n "$cpid" ]; then wait "$cpid"; log "cotrain_checks rc=$?"; tail -3 "$W/cotrain_checks.log"; fi
mkdir -p "$W/runs"
(cd "$WORK" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' \) ! -path '*/ckpt/*' \
   ! -path '*/checkpoints/*' -print0 | tar cf - --null -T -) | tar xf - -C "$W/runs"
(cd "$W" && find . -type f -print0 | tar czf "$OUT/study.tgz" --null -T -) && log "packed $(du -h "$OUT/study.tgz" | cut -f1)"
