#!/usr/bin/env bash
# One device call (nvidia-h200-x2) that asks whether the speculative rollout draws plain sampling's completions on
# the real math workload (repro.bench.workload_law), at the warm start and after 60 steps of co-training: the
# follow-up of the h200 exchangeability study, whose co-trained runs earned less training reward than the no-draft
# runs (results/1xh200/h200/exchangeability/README.md). In order:
#   1. the math SFT warm start (warm_sft.sh "0:fig3", JOBS=1) unless WARM names one;
#   2. GPU 0: workload_law from the warm start; GPU 1 at once: fig3's RUN_ROW with sampling seed 1 (60 steps,
#      checkpointed at the end) into .cache/sampler_run;
#   3. GPU 0: workload_law from that run's checkpoint (--from-run): its policy, and its draft for its family;
#      GPU 1 at once: fig3's no-draft row with sampling seed 1 into .cache/sampler_run/nodraft, to compare step for
#      step with the committed fig3/no_draft_sampling1 (same code path, sessions 12-13's commit).
# Writes only $OUT/sampler_study.tgz (both reports and logs, both runs' env/metrics/run.json and log); files are staged
# in .cache/sampler_pack. Runs in the repository root.
#   REPRO_GIT_SHA=<sha> [BUDGET_S=80] [RUN_ROW=EAGLE-3] bash scripts/device/sampler_study.sh
#   OUT=/tmp/o PY=.venv/bin/python PROFILE=cpu-tiny WARM=results/cpu-2c/cpu-tiny/sft/dense-math \
#     LAW_ARGS="--prompts 4 --group 8 --calls 1" bash scripts/device/sampler_study.sh                # CPU dry run
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
PY=${PY:-python3}; : "${OUT:?set OUT}"; W=.cache/sampler_pack; RUN=.cache/sampler_run
rm -rf "$W" "$RUN"; mkdir -p "$W" "$RUN" "$OUT"
log() { echo "[$(date +%T)] $*"; }
PROFILE=${PROFILE:-h200}; ROW=${RUN_ROW:-EAGLE-3}
if [ -z "${WARM:-}" ]; then
  log "math SFT warm start"
  OUT=$W JOBS=1 PY=$PY PROFILE=$PROFILE bash scripts/device/warm_sft.sh "0:fig3" > "$W/warm_sft.log" 2>&1
  WARM=$(ls -d .cache/sft_job0/dense-math-*/ 2>/dev/null | head -1)
fi
[ -n "$WARM" ] && [ -f "$WARM/policy.pt" ] || { echo "no math SFT warm start (WARM='$WARM')" >&2; exit 2; }

law() {   # law OUTDIR [more workload_law args]
  # shellcheck disable=SC2086 -- LAW_ARGS is a word list
  "$PY" -m repro.bench.workload_law --out "$1" --profile "$PROFILE" --warm-start "$WARM" \
    --budget-s "${BUDGET_S:-80}" ${LAW_ARGS:-} "${@:2}" > "$1.log" 2>&1
}
log "workload_law from the warm start (GPU 0) beside fig3 '$ROW' sampling seed 1 (GPU 1)"
(CUDA_VISIBLE_DEVICES=0 law "$W/law_warm"; log "law_warm rc=$?") &
lpid=$!
CUDA_VISIBLE_DEVICES=1 "$PY" -m repro.rl.run --artifact fig3 --row "$ROW" --profile "$PROFILE" --out "$RUN/run" \
  --warm-start "$WARM" --seed 0 --sampling-seed 1 > "$RUN/run.log" 2>&1
log "run rc=$?"
wait "$lpid"
# the no-draft row at this commit with the same sampling seed: equal, step for step, to the committed
# results/1xh200/h200/fig3/no_draft_sampling1 (the study's baseline runs come from sessions 12-13's code)
log "fig3 'no draft' sampling seed 1 (GPU 1)"
(CUDA_VISIBLE_DEVICES=1 "$PY" -m repro.rl.run --artifact fig3 --row "no draft" --profile "$PROFILE" \
  --out "$RUN/nodraft" --warm-start "$WARM" --seed 0 --sampling-seed 1 > "$RUN/nodraft.log" 2>&1; log "no-draft run rc=$?") &
npid=$!
if [ -f "$RUN/run/ckpt/latest.pt" ]; then
  log "workload_law from the run's checkpoint (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 law "$W/law_trained" --from-run "$RUN/run"; log "law_trained rc=$?"
fi
wait "$npid"
grep -h "^\[workload_law\]\|passed=" "$W"/law_*.log
for r in run nodraft; do
  mkdir -p "$W/$r"
  cp "$RUN/$r.log" "$W/$r/" 2>/dev/null
  find "$RUN/$r" -maxdepth 1 -type f \( -name '*.json' -o -name '*.jsonl' \) -exec cp {} "$W/$r/" \;
done
(cd "$W" && find . -type f -print0 | tar czf "$OUT/sampler_study.tgz" --null -T -) \
  && log "packed $(du -h "$OUT/sampler_study.tgz" | cut -f1)"
