#!/usr/bin/env bash
# exact-v1 on a GPU: CUDA-vs-CPU digests of gpt-tiny and a GPT-2-small step on every integer-GEMM
# route, and an exact-v1 step timed against stock fp32, TF32 and bf16-autocast steps on the same
# GPU. Prints progress on stderr and one JSON line on stdout; exit status 1 on any mismatch or
# failure. On two or more GPUs it also walks gpt-tiny data-parallel over NCCL (2 ranks under
# torchrun), which must give the CPU's digests. Without CUDA it runs its CPU half (the CPU walks on
# every route). No network.
#
#   bench/gpu.sh                 # the whole run (about 3-5 minutes on one GPU; capped at 470 s)
#   bench/gpu.sh --quick         # gpt-tiny only (what the test suite runs)
#   bench/gpu.sh --help          # the other options (timing batch, reps, time budget)
#
# The interpreter is $PYTHON, else the repository's .venv (./scripts/setup), else python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "gpu.sh: $PYTHON cannot import torch; run ./scripts/setup first or set PYTHON" >&2
  exit 2
fi
exec timeout --signal=TERM --kill-after=10 470 "$PYTHON" bench/gpu.py "$@"
