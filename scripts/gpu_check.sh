#!/usr/bin/env bash
# A short strategy check on a GPU machine (one GPU split into two logical GPUs with memory limits): autoplace's
# default against one logical GPU and a copy per logical GPU, measured beside predicted. Skips with a message
# where no GPU is visible. Usage: ./scripts/gpu_check.sh [--memory-mb 4096] [--repeats 7]
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then ./scripts/env.sh; fi
exec .venv/bin/python benchmarks/gpu_check.py "$@"
