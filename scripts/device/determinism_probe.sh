#!/usr/bin/env bash
# Which operations make the block drafts' offline training (repro.rl.sft) not bit-reproducible on a GPU? Runs a few
# steps of the math SFT (policy, then the DFlash and DSpark drafts) with torch.use_deterministic_algorithms(True,
# warn_only=True): torch warns once per operation that has no deterministic CUDA implementation. Writes
# $OUT/determinism/{probe.log,warnings.txt,profile.yaml}. Runs in the repository root.
#   REPRO_GIT_SHA=<sha> bash scripts/device/determinism_probe.sh
#   OUT=/tmp/o PY=.venv/bin/python PROFILE=cpu-tiny bash scripts/device/determinism_probe.sh   # CPU dry run
set -uo pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled CUBLAS_WORKSPACE_CONFIG=:4096:8
PY=${PY:-python3}; W=${OUT:?set OUT}/determinism; mkdir -p "$W"
"$PY" -m repro.rl.derive_profile --profile "${PROFILE:-h200}" --out "$W/profile.yaml" rl.sft.steps=3 \
  rl.sft.draft_steps=3 || exit 1
"$PY" - "$W" > "$W/probe.log" 2>&1 <<'PYEOF'
import runpy, sys, warnings
import torch
out = sys.argv[1]
torch.use_deterministic_algorithms(True, warn_only=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sys.argv = ["repro.rl.sft", "--profile", f"{out}/profile.yaml", "--policy", "dense", "--workload", "math",
                "--drafts", "dflash,dspark", "--out", f"{out}/sft"]
    try:
        runpy.run_module("repro.rl.sft", run_name="__main__")
    except SystemExit as exc:      # the module's main ends with sys.exit
        if exc.code not in (0, None):
            raise
found = sorted({str(w.message).split("\n")[0] for w in caught if "deterministic" in str(w.message)})
open(f"{out}/warnings.txt", "w").write("\n".join(found) + "\n")
print(f"[determinism_probe] {len(found)} non-deterministic operation(s)")
for f in found:
    print(" ", f)
PYEOF
echo "rc=$?"; tail -n 12 "$W/probe.log"; rm -rf "$W/sft/drafts" "$W/sft/policy.pt"
