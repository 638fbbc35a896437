#!/usr/bin/env bash
# Does co-training change how the policy learns? Runs ROWS of ARTIFACT (default fig3's no-draft, EAGLE-3 and DSpark
# rows) over the sampling seeds SEEDS (default 0-7) from one SFT warm start, JOBS at a time, into run folders under
# WORK (default .cache/exchangeability: ignored by git, so `collect` never mixes them into the figure), then tests
# whether each drafted row's runs and the no-draft row's are exchangeable (repro.report.exchangeability: per-run
# means, exact permutation test) and writes $OUT/report.{json,md}, which keep every run's per-step values. Seed 0 is
# the workflow's main run (no --sampling-seed), so its runs reproduce the figure's. Runs in the repository root.
#   OUT=results/cpu-2c/cpu-tiny/exchangeability [PROFILE=cpu-tiny] [ARTIFACT=fig3] [ROWS="no draft,EAGLE-3,DSpark"] \
#     [SEEDS=0,1,2,3,4,5,6,7] [JOBS=2] [WARM=results/cpu-2c/cpu-tiny/sft/dense-math] [WORK=.cache/exchangeability] \
#     bash scripts/experiments/exchangeability.sh
# Also: GPUS=0,1 (job slot i runs on GPU i mod n, CUDA_VISIBLE_DEVICES), THREADS (torch threads per run; default 1,
# 0 = torch's default), DEADLINE (epoch seconds: no run starts after it), REPORT_RUNS (more run folders or folders of
# runs for the report, e.g. a figure's baseline runs: space-separated), REPORT=0 (runs only).
set -euo pipefail
: "${OUT:?set OUT to the report folder}"
PY=${PY:-.venv/bin/python}; WORK=${WORK:-.cache/exchangeability}; WARM=${WARM:-results/cpu-2c/cpu-tiny/sft/dense-math}
[ -f "$WARM/policy.pt" ] || { echo "WARM=$WARM: no SFT warm start there (policy.pt); run the workflow's SFT first," \
  "e.g. .venv/bin/snakemake -c2 fig3" >&2; exit 2; }
mkdir -p "$WORK" "$OUT"
# one line per run: its folder, then repro.rl.run's arguments (a run already finished in WORK is kept: resumable)
"$PY" - "${ARTIFACT:-fig3}" "${ROWS:-no draft,EAGLE-3,DSpark}" "${SEEDS:-0,1,2,3,4,5,6,7}" "$WORK" > "$WORK/jobs.txt" <<'PYEOF'
import sys
from repro.rl.summary import run_dir_name
art, rows, seeds, work = sys.argv[1:]
for row in rows.split(","):
    for k in (int(s) for s in seeds.split(",")):
        print(f"{work}/{run_dir_name(row)}_s{k}\t{art}\t{row}\t{k}")
PYEOF
echo "[$(date +%T)] $(wc -l < "$WORK/jobs.txt") runs, ${JOBS:-2} at a time, into $WORK"
run_one() {
  IFS=$'\t' read -r dir art row k <<< "$1"
  [ -f "$dir/run.json" ] && { echo "[$(date +%T)] kept $dir"; return 0; }
  [ -n "${DEADLINE:-}" ] && [ "$(date +%s)" -ge "$DEADLINE" ] && { echo "[$(date +%T)] past DEADLINE: not started $dir"; return 0; }
  seed=(); [ "$k" = 0 ] || seed=(--sampling-seed "$k")
  gpu=(); if [ -n "${GPUS:-}" ]; then IFS=, read -ra g <<< "$GPUS"; gpu=(env "CUDA_VISIBLE_DEVICES=${g[$((SLOT % ${#g[@]}))]}"); fi
  omp=(); [ "${THREADS:-1}" = 0 ] || omp=("OMP_NUM_THREADS=${THREADS:-1}")
  "${gpu[@]}" env "${omp[@]}" WANDB_MODE=disabled "$PY" -m repro.rl.run --artifact "$art" \
    --row "$row" --profile "${PROFILE:-cpu-tiny}" --out "$dir" --warm-start "$WARM" --seed 0 "${seed[@]}" \
    --threads "${THREADS:-1}" > "$dir.log" 2>&1 || { echo "run failed: $dir (log $dir.log)" >&2; return 1; }
  echo "[$(date +%T)] done $dir${gpu:+ (${gpu[1]})}"
}
export -f run_one; export PY WARM PROFILE GPUS THREADS DEADLINE
tr '\n' '\0' < "$WORK/jobs.txt" | xargs -0 -P "${JOBS:-2}" --process-slot-var=SLOT -I{} bash -c 'run_one "$@"' _ {}
[ "${REPORT:-1}" = 0 ] && exit 0
extra=(); for r in ${REPORT_RUNS:-}; do extra+=(--runs "$r"); done
"$PY" -m repro.report.exchangeability --runs "$WORK" "${extra[@]}" --out "$OUT"
