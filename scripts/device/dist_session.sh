#!/usr/bin/env bash
# One device call on 2 GPUs of one host (kind nvidia-h200-x2): the distributed co-training row under torchrun with
# NCCL, a few steps per layout (PP=2 x CP=1 with the taps over CUDA IPC, then PP=1 x CP=2), h200 models, microbatches
# of $MICROBATCH sequences (default: 8 with PP, so that 1F1B has 8 microbatches to overlap; the profile's 32 without,
# as the single-process update; sessions 7-9 ran CP=2 with 8), packed into $OUT/dist.tgz. Ran in session 7 (commit
# 5a45e08, results/2xh200/h200/dist/) from random init, where every reward is 0 and so the policy's gradient too; with
# WARM_START=1 the dense policy and the rows' drafts are first supervised (repro.rl.sft, ~140 s) and the rows start
# from that warm start, so rewards and the policy's update are real. Step $PROFILE_UPDATE's update (default 2; -1:
# none) runs under torch.profiler on every rank (<run>/profile_update_rank<r>.txt/.json; session 9's fp32 CP=2
# profile: results/2xh200/h200/dist/warm_start/cp2_profile). A profiled update took over 100 s on the H200 in
# session 8 (the profiler's post-processing), so give RUN_TIMEOUT room and profile few rows (LAYOUTS="1 2" runs only
# CP=2; "PP CP;..."). The tarball is packed after every run.
# CPU/gloo runs of the same entry: tests/rl/test_dist_run.py. Runs in the repository root.
#   REPRO_GIT_SHA=<sha> [RUN_TIMEOUT=240] [WARM_START=1] [PROFILE_UPDATE=2] [LAYOUTS="2 1;1 2"] bash scripts/device/dist_session.sh [STEPS] [ROWS...]
#   PATH=.venv/bin:$PATH PROFILE=cpu-tiny OUT=/tmp/d bash scripts/device/dist_session.sh 1 "Qwen3-8B/DFlash"  # CPU
set -uo pipefail
STEPS=${1:-4}; shift || true
ROWS=("$@"); [ ${#ROWS[@]} -gt 0 ] || ROWS=("Qwen3-8B/EAGLE-3" "Qwen3-8B/DFlash")
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled OMP_NUM_THREADS=1
# the device host shares its GPUs: NVLink multicast stays off (the device README), also for torchrun's children
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
W=$OUT/work; mkdir -p "$W"
nvidia-smi topo -m > "$W/topology.txt" 2>&1
# packed after every run, so a call cut short by its time limit still returns the runs that finished
pack() { (cd "$W" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.txt' \) -print0 \
   | tar czf "$OUT/dist.tgz.tmp" --null -T -) && mv "$OUT/dist.tgz.tmp" "$OUT/dist.tgz"; }
WARM=()
if [ "${WARM_START:-0}" = 1 ]; then
  drafts=$(for row in "${ROWS[@]}"; do case "$row" in *EAGLE-3) echo eagle3;; *DFlash) echo dflash;; *DSpark) echo dspark;; esac; done \
           | sort -u | paste -sd, -)
  echo "[$(date +%T)] SFT warm start (dense policy, drafts $drafts)"
  timeout 400 python3 -m repro.rl.sft --profile "${PROFILE:-h200}" --policy dense --workload math --drafts "$drafts" \
    --out "$W/sft" > "$W/sft.log" 2>&1 || { echo "SFT failed"; tail -5 "$W/sft.log"; }
  WARM=(--warm-start "$W/sft"); pack
fi
for row in "${ROWS[@]}"; do
  name=$(echo "$row" | tr 'A-Z/ ' 'a-z__' | tr -cd 'a-z0-9_.-')
  IFS=';' read -ra layouts <<< "${LAYOUTS:-2 1;1 2}"
  for layout in "${layouts[@]}"; do
    set -- $layout
    echo "[$(date +%T)] $row pp=$1 cp=$2"
    timeout "${RUN_TIMEOUT:-240}" python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m repro.rl.dist_run \
      --artifact table1 --row "$row" --profile "${PROFILE:-h200}" --pp "$1" --cp "$2" --steps "$STEPS" \
      --microbatch "${MICROBATCH:-$([ "$1" -gt 1 ] && echo 8 || echo 0)}" "${WARM[@]}" --profile-update "${PROFILE_UPDATE:-2}" \
      --out "$W/${name}_pp$1cp$2" > "$W/${name}_pp$1cp$2.log" 2>&1
    rc=$?; echo "[$(date +%T)] rc=$rc"; tail -3 "$W/${name}_pp$1cp$2.log"; pack
  done
done

