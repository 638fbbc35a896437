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
  seed=(); [ "$k" = 0 ] || seed=(--sampling-seed "$k")
  OMP_NUM_THREADS=1 WANDB_MODE=disabled "$PY" -m repro.rl.run --artifact "$art" --row "$row" \
    --profile "${PROFILE:-cpu-tiny}" --out "$dir" --warm-start "$WARM" --seed 0 "${seed[@]}" --threads 1 \
    > "$dir.log" 2>&1 || { echo "run failed: $dir (log $dir.log)" >&2; return 1; }
  echo "[$(date +%T)] done $dir"
}
export -f run_one; export PY WARM PROFILE
tr '\n' '\0' < "$WORK/jobs.txt" | xargs -0 -P "${JOBS:-2}" -I{} bash -c 'run_one "$@"' _ {}
"$PY" -m repro.report.exchangeability --runs "$WORK" --out "$OUT"
