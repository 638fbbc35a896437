#!/usr/bin/env bash
# The first call on a warm machine: the SFT warm starts (policy and every draft) that the calls after it reuse, one
# artifact's workload per "GPU:ARTIFACT" spec, all at once (repro.bench.gpu_rl --sft-only), into .cache/sft_job0,
# then copied to .cache/sft_job1..N-1 so that each of parallel_rl.sh's N jobs finds it in its own cache (JOBS, default
# 2). The next call must come within the machine's idle window (30 s), or the cache is gone. Writes only
# $OUT/warm_sft.tgz (each spec's gpu_rl.json and SFT log; the work files stay in .cache/warm_sft), so that a job run
# beside it in the same call has room in the device's 8 returned files. Runs in the repository root.
#   REPRO_GIT_SHA=<sha> [JOBS=2] bash scripts/device/warm_sft.sh "0:fig3" "1:fig4"
#   OUT=/tmp/o PY=.venv/bin/python PROFILE=cpu-tiny SFT_STEPS=3 bash scripts/device/warm_sft.sh "0:fig3"  # CPU dry run
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 'GPU:ARTIFACT' ..." >&2; exit 2; }
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
PY=${PY:-python3}; : "${OUT:?set OUT}"; W=.cache/warm_sft; rm -rf "$W"; mkdir -p "$W" "$OUT"
pids=()
for spec in "$@"; do
  gpu=${spec%%:*}; art=${spec#*:}
  [[ $gpu =~ ^[0-9]+$ ]] || { echo "spec '$spec': expected GPU:ARTIFACT, e.g. 0:fig3" >&2; exit 2; }
  echo "[$(date +%T)] SFT for $art on GPU $gpu"
  CUDA_VISIBLE_DEVICES=$gpu "$PY" -m repro.bench.gpu_rl --profile "${PROFILE:-h200}" --artifact "$art" --sft-only \
    --sft-cache .cache/sft_job0 --out "$W/$art" ${SFT_STEPS:+--sft-steps $SFT_STEPS} > "$W/$art.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
for j in $(seq 1 $((${JOBS:-2} - 1))); do rm -rf ".cache/sft_job$j"; cp -r .cache/sft_job0 ".cache/sft_job$j"; done
echo "[$(date +%T)] rc=$rc; caches: $(ls .cache/sft_job0 | tr '\n' ' ')"
(cd "$W" && find . -type f \( -name '*.json' -o -name '*.log' \) -print0 | tar czf "$OUT/warm_sft.tgz" --null -T -)
exit $rc
