#!/usr/bin/env bash
# One device call on 2 GPUs of one host: the PP=1 x CP=2 co-training row with its update under bf16 autocast
# (--update-dtype auto: the ring takes the fused bf16 kernels, as the single-process update does) and in fp32 (the
# ring's fp32 fallback, every update before commit of this script), same row and steps, random init; packed into
# $OUT/cp_dtype.tgz after each run. Runs in the repository root.
# MICROBATCH: sequences per microbatch, default 0 = the profile's (32, as the single-process update); session 9's
# call ran with 8 (its default then).
#   REPRO_GIT_SHA=<sha> [RUN_TIMEOUT=95] [STEPS=2] [ROW=Qwen3-8B/DFlash] [MICROBATCH=0] bash scripts/device/cp_dtype.sh
#   PROFILE=cpu-tiny OUT=/tmp/c STEPS=1 bash scripts/device/cp_dtype.sh        # CPU (gloo) check: fp32 both times
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled OMP_NUM_THREADS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the device README
PY=${PY:-python3}; W=$OUT/work; mkdir -p "$W"
pack() { (cd "$W" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' \) -print0 \
   | tar czf "$OUT/cp_dtype.tgz.tmp" --null -T -) && mv "$OUT/cp_dtype.tgz.tmp" "$OUT/cp_dtype.tgz"; }
for dt in auto float32; do
  echo "[$(date +%T)] cp=2 --update-dtype $dt"
  timeout "${RUN_TIMEOUT:-95}" "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 -m repro.rl.dist_run \
    --artifact table1 --row "${ROW:-Qwen3-8B/DFlash}" --profile "${PROFILE:-h200}" --pp 1 --cp 2 \
    --steps "${STEPS:-2}" --microbatch "${MICROBATCH:-0}" --update-dtype "$dt" --out "$W/cp2_$dt" \
    > "$W/cp2_$dt.log" 2>&1
  rc=$?; echo "[$(date +%T)] rc=$rc"; grep -h "step [0-9]*:" "$W/cp2_$dt.log" | tail -3; pack
done
