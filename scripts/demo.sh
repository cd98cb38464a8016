#!/usr/bin/env bash
# Set up the environment if needed, then run the quickstart demo on 4 logical CPU devices;
# --workers: the two-worker demo instead (two TF gRPC workers in a loopback-only namespace, measured
# against one worker and a copy of the model per worker).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/env.sh
if [[ "${1:-}" == "--workers" ]]; then
  shift
  exec .venv/bin/python examples/two_workers.py "$@"
fi
exec .venv/bin/python examples/quickstart.py "$@"
