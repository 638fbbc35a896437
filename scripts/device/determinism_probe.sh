#!/usr/bin/env bash
# Which operations make the block drafts' offline training (repro.rl.sft) not bit-reproducible on a GPU? Runs a few
# steps of the math SFT (policy, then the DFlash and DSpark drafts) with torch.use_deterministic_algorithms(True,
# warn_only=True): torch warns once per operation that has no deterministic CUDA implementation. Writes
# $OUT/determinism/{probe.log,warnings.txt,profile.yaml}. Then the check of the fix: a short math SFT with 20 draft
# steps, twice with rl.sft.deterministic false and twice true; $OUT/determinism/reproducible.json says per setting
# whether the two runs' draft losses (every step's) are bit-identical. DRAFT_STEPS (default 20) sets the check's draft
# steps: 150 (the h200 profile's) gives both settings' whole offline-training curves. All of it is packed into
# $OUT/determinism.tgz, with warnings.txt and reproducible.json also beside it. Runs in the repository root.
#   REPRO_GIT_SHA=<sha> [DRAFT_STEPS=20] bash scripts/device/determinism_probe.sh
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
for det in false true; do
  "$PY" -m repro.rl.derive_profile --profile "${PROFILE:-h200}" --out "$W/profile_$det.yaml" rl.sft.steps=3 \
    rl.sft.draft_steps=${DRAFT_STEPS:-20} rl.sft.deterministic=$det > /dev/null || exit 1
  for rep in 1 2; do
    "$PY" -m repro.rl.sft --profile "$W/profile_$det.yaml" --policy dense --workload math --drafts dflash,dspark \
      --out "$W/rep_${det}_$rep" > "$W/rep_${det}_$rep.log" 2>&1 || echo "SFT deterministic=$det rep $rep failed"
  done
done
"$PY" - "$W" <<'PYEOF'
import json, sys
from pathlib import Path
from repro.report.provenance import provenance, write_json_atomic
w = Path(sys.argv[1])
out = {}
for det in ("false", "true"):
    runs = [json.loads((w / f"rep_{det}_{r}" / "sft.json").read_text()) for r in (1, 2)]
    out[f"deterministic_{det}"] = {"identical": runs[0]["drafts"] == runs[1]["drafts"],
                                   "drafts": [r["drafts"] for r in runs], "draft_time_s": [
                                       r["total_time_s"] - r["sft_time_s"] for r in runs]}
write_json_atomic(w / "reproducible.json", {**out, "provenance": provenance({"script": "determinism_probe.sh"})})
print({k: v["identical"] for k, v in out.items()})
PYEOF
rm -rf "$W"/rep_*/drafts "$W"/rep_*/policy.pt "$W"/rep_*/tokenizer "$W/sft/tokenizer"
# the device returns at most 8 files: one tarball, and the two answers beside it
tar czf "$OUT/determinism.tgz" -C "$OUT" determinism && cp "$W/reproducible.json" "$W/warnings.txt" "$OUT/" \
  && rm -rf "$W"
