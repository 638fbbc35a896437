#!/usr/bin/env bash
# One H200 device call: the host's CPU/NUMA topology and CPU pressure, then repro.bench.host_binding (fresh pinned
# processes timing the same no-draft update and rollouts), packed into $OUT/hb.tgz. Runs in the repository root.
#   REPRO_GIT_SHA=<sha> bash scripts/device/host_binding_session.sh [ROUNDS]
set -uo pipefail
ROUNDS=${1:-2}
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
W=$OUT/work; mkdir -p "$W"
topology() {
  echo "nproc $(nproc)"; grep -i cpus_allowed_list /proc/self/status; cat /proc/loadavg
  echo "--- cpu pressure"; cat /proc/pressure/cpu 2>&1; echo "--- cgroup cpu.max"; cat /sys/fs/cgroup/cpu.max 2>&1
  echo "--- lscpu"; lscpu 2>&1; echo "--- nvidia-smi topo"; nvidia-smi topo -m 2>&1; echo "--- numactl"; numactl -H 2>&1
}
topology > "$W/topology_before.txt" 2>&1
timeout 480 python3 -m repro.bench.host_binding --profile h200 --rounds "$ROUNDS" --out "$W/host_binding" \
  > "$W/host_binding.log" 2>&1
echo "host_binding rc=$?"
{ cat /proc/loadavg; cat /proc/pressure/cpu; } > "$W/topology_after.txt" 2>&1
(cd "$W" && find . -type f \( -name '*.json' -o -name '*.log' -o -name '*.txt' \) ! -path '*/runs/*' -print0 \
   | tar czf "$OUT/hb.tgz" --null -T -)
tail -12 "$W/host_binding.log"; head -4 "$W/topology_before.txt"
