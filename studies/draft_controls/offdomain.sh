#!/usr/bin/env bash
# Do co-trained drafts adapt to a workload they were not trained on? The paper's drafts are trained offline on other
# data than the RL task and adapt online (its Figure 4: acceptance length rises). Here: fig4's workplace policy SFT
# as usual, its drafts warm-started on the *math* workload's demonstrations (rl.sft.workloads.workplace.draft_workload:
# math, in a derived profile), then fig4's drafted rows co-trained (loss_weight 1) and frozen (loss_weight 0) from
# that warm start (repro.rl.draft_sweep). Writes $OUT/profile.yaml, $OUT/sft/ (sft.json; weights are ignored by git)
# and $OUT/sweep.json. Runs in the repository root.
#   OUT=results/cpu-2c/cpu-tiny/draft_offdomain [PROFILE=cpu-tiny] [JOBS=2] [STEPS=0: the artifact's] \
#     [ROWS=EAGLE-3,DFlash,DSpark] [KEY=loss_weight VALUES=0,1: another draft setting, e.g. KEY=lr] \
#     [DRAFT_WORKLOAD=math; workplace gives the in-domain control: drafts warm-started on fig4's own workload] \
#     bash scripts/experiments/draft_offdomain.sh
set -euo pipefail
: "${OUT:?set OUT to the results folder}"
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
"$PY" -m repro.rl.derive_profile --profile "${PROFILE:-cpu-tiny}" --out "$OUT/profile.yaml" \
  rl.sft.workloads.workplace.draft_workload="${DRAFT_WORKLOAD:-math}"
echo "[$(date +%T)] SFT: workplace policy, drafts on ${DRAFT_WORKLOAD:-math}"
OMP_NUM_THREADS=1 "$PY" -m repro.rl.sft --profile "$OUT/profile.yaml" --policy dense --workload workplace \
  --drafts eagle3,dflash,dspark --threads 1 --out "$OUT/sft" > "$OUT/sft.log" 2>&1
echo "[$(date +%T)] fig4 rows, drafts co-trained and frozen"
OMP_NUM_THREADS=1 "$PY" -m repro.rl.draft_sweep --profile "$OUT/profile.yaml" --artifact fig4 \
  --rows "${ROWS:-EAGLE-3,DFlash,DSpark}" --key "${KEY:-loss_weight}" --values "${VALUES:-0,1}" \
  --warm-start "$OUT/sft" --jobs "${JOBS:-2}" --steps "${STEPS:-0}" --out "$OUT"
