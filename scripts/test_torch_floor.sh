#!/usr/bin/env bash
# The test suite on the oldest torch pyproject.toml allows: torch 2.11.0 with transformers 5.17.0 and Triton 3.6.0,
# the versions of the CUDA machines the suite's GPU results come from, run here on the CPU. CI runs torch 2.13 only;
# run this after touching torch.compile, dynamo, pipelining or Triton code, before spending GPU time.
#   bash scripts/test_torch_floor.sh                 # all tests
#   bash scripts/test_torch_floor.sh tests/rollout   # pytest arguments pass through
# It builds .venv-floor once (torch's Linux wheel on PyPI is the CUDA build: about 3 GB with its CUDA libraries,
# which it loads on a CPU too) over .venv's other packages (needs `bash scripts/setup.sh` first). numpy stays under
# 2.4 there: Triton 3.6's interpreter, which the kernel tests run on a CPU, cannot read numpy 2.4's scalars.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,9p' "$0"; exit 0 ;; esac
FLOOR=${FLOOR:-.venv-floor}
PINS=(torch==2.11.0 triton==3.6.0 transformers==5.17.0 "huggingface-hub>=1.5,<2" "numpy<2.4")
[ -x .venv/bin/python ] || { echo "test_torch_floor.sh: no .venv here; run 'bash scripts/setup.sh' first" >&2; exit 2; }
stamp="$FLOOR/.installed-$(printf '%s\n' "${PINS[@]}" | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x "$FLOOR/bin/python" ] || .venv/bin/python -m venv "$FLOOR"
  # .venv's packages (the suite's editable install, pytest, wandb, ...) after the floor's own, which shadow them; a
  # site directory, so that its own .pth files (the editable install's) count too
  main_site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  floor_site=$("$FLOOR/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "import site; site.addsitedir('$main_site')" > "$floor_site/zz-main-venv.pth"
  "$FLOOR/bin/python" -m pip install -q "${PINS[@]:0:2}"     # torch and Triton, with torch's CUDA libraries
  "$FLOOR/bin/python" -m pip install -q --no-deps "${PINS[@]:2}"
  touch "$stamp"
fi
"$FLOOR/bin/python" -c "import torch, transformers, triton, numpy
print(f'torch {torch.__version__}, transformers {transformers.__version__}, triton {triton.__version__}, '
      f'numpy {numpy.__version__}')"
exec "$FLOOR/bin/python" -m pytest -q -p no:cacheprovider "$@"
