#!/usr/bin/env bash
# One device job: how much supervised warm start leaves a workload room for RL. For each N in STEPS, the profile's
# policy SFT on WORKLOAD with exactly N steps (rl.sft.workloads.<WORKLOAD>.steps = N in a derived profile, the same
# path the RL runs' warm start takes, so the learning-rate schedule is the one that N steps get) and its held-out
# accuracy (greedy, 30 tasks) in <N>/sft.json; the last N also records the curve every 10 steps (heldout_curve), for
# the record only: mid-run points see a learning rate that a shorter run has already decayed. No drafts are trained.
# Packs $OUT/sft_sweep.tgz. Runs in the repository root; CPU check: PROFILE=cpu-tiny OUT=/tmp/s bash ... math 5 10
#   REPRO_GIT_SHA=<sha> [PROFILE=h200] [POLICY=dense] bash scripts/device/sft_sweep.sh WORKLOAD N [N ...]
#   e.g. bash scripts/device/sft_sweep.sh workplace 30 50 70 100 200
set -uo pipefail
WORKLOAD=${1:?workload (math or workplace)}; shift
[ $# -ge 1 ] || { echo "usage: $0 WORKLOAD N [N ...]  (SFT step counts to try)" >&2; exit 2; }
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
W=$OUT/work; mkdir -p "$W"
last=${!#}
for n in "$@"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "step count '$n' is invalid: expected a positive integer" >&2; exit 2; }
  python3 -m repro.rl.derive_profile --profile "${PROFILE:-h200}" --out "$W/profile_sft$n.yaml" \
    "rl.sft.workloads.$WORKLOAD.steps=$n" || exit 2
  every=0; [ "$n" = "$last" ] && every=10
  echo "[$(date +%T)] SFT $WORKLOAD, $n steps (held-out every $every)"
  timeout 500 python3 -m repro.rl.sft --profile "$W/profile_sft$n.yaml" --policy "${POLICY:-dense}" \
    --workload "$WORKLOAD" --out "$W/$n" --heldout-every "$every" > "$W/sft$n.log" 2>&1
  echo "[$(date +%T)] rc=$? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('held-out', d['heldout_accuracy'], 'sft', round(d['sft_time_s']), 's')" "$W/$n/sft.json" 2>&1)"
done
(cd "$W" && find . -type f \( -name '*.json' -o -name '*.log' -o -name '*.yaml' \) -print0 \
   | tar czf "$OUT/sft_sweep.tgz" --null -T -)
