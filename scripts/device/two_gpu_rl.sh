#!/usr/bin/env bash
# One device call on 2 GPUs of one host (kind nvidia-h200-x2): two independent rl_session.sh jobs at once, one per
# GPU (CUDA_VISIBLE_DEVICES, so each job sees and records one H200), each packed into $OUT/gpu<N>/rl.tgz.
# Meant for curve runs (fig3/fig4: rewards, accuracies, acceptance lengths), whose values do not depend on speed;
# speed rows (table1/table2) run alone, since the two jobs share the host's CPUs. Runs in the repository root.
#   REPRO_GIT_SHA=<sha> bash scripts/device/two_gpu_rl.sh "ARGS FOR GPU 0" "ARGS FOR GPU 1"
#   e.g. bash scripts/device/two_gpu_rl.sh "fig4 400 0" "fig3 300 0 --seed-replicas-only --seeds 3,4 --steps 20"
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 'rl_session args for GPU 0' 'rl_session args for GPU 1'" >&2; exit 2; }
ROOT=$OUT
pids=()
for gpu in 0 1; do
  args=${1}; shift
  mkdir -p "$ROOT/gpu$gpu"
  echo "[$(date +%T)] GPU $gpu: rl_session.sh $args"
  # shellcheck disable=SC2086 -- the arguments are one word list by design
  CUDA_VISIBLE_DEVICES=$gpu OUT=$ROOT/gpu$gpu bash scripts/device/rl_session.sh $args > "$ROOT/gpu$gpu/session.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in 0 1; do wait "${pids[$i]}" || rc=$?; echo "[$(date +%T)] GPU $i done"; tail -4 "$ROOT/gpu$i/session.log"; done
exit $rc
