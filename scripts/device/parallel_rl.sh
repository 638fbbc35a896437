#!/usr/bin/env bash
# One device call on the GPUs of one host: independent rl_session.sh jobs at once, each "GPU:ARGS" on the GPU named
# (CUDA_VISIBLE_DEVICES, so the job sees and records one H200; two jobs may share a GPU), each with its own SFT cache
# (.cache/sft_job<N>) and packed into $OUT/job<N>/rl.tgz. Meant for curve runs (fig3/fig4 rewards, accuracies,
# acceptance lengths), whose values do not depend on speed: the jobs share the host's CPUs, so speed rows
# (table1/table2) run alone. Runs in the repository root. (Session 7's call 5 ran it as two_gpu_rl.sh, commit 5a45e08.)
#   REPRO_GIT_SHA=<sha> bash scripts/device/parallel_rl.sh "GPU:ARGS" ["GPU:ARGS" ...]
#   e.g. bash scripts/device/parallel_rl.sh "0:fig4 390 0" "1:fig3 300 0 --seed-replicas-only --seeds 3,4 --steps 20"
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 'GPU:rl_session args' ..." >&2; exit 2; }
ROOT=$OUT
pids=()
for i in $(seq 0 $(($# - 1))); do
  spec=${1}; shift
  gpu=${spec%%:*}; args=${spec#*:}
  [[ $gpu =~ ^[0-9]+$ ]] || { echo "job '$spec': expected GPU:ARGS with a GPU index, e.g. 0:fig3 300 0" >&2; exit 2; }
  mkdir -p "$ROOT/job$i"
  echo "[$(date +%T)] job $i on GPU $gpu: rl_session.sh $args"
  # shellcheck disable=SC2086 -- the arguments are one word list by design
  CUDA_VISIBLE_DEVICES=$gpu OUT=$ROOT/job$i SFT_CACHE=.cache/sft_job$i bash scripts/device/rl_session.sh $args \
    > "$ROOT/job$i/session.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || rc=$?
  echo "[$(date +%T)] job $i done"; tail -4 "$ROOT/job$i/session.log"
done
exit $rc
