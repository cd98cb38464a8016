#!/usr/bin/env bash
# Set up the environment if needed, then run the quickstart demo on 4 logical CPU devices.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/env.sh
exec .venv/bin/python examples/quickstart.py "$@"
