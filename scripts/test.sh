#!/usr/bin/env bash
# Set up the environment if needed, then run the whole test suite (tests + doctests).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/env.sh
./scripts/browser.sh || echo "chromium could not be installed; the browser test will skip" >&2
exec .venv/bin/python -m pytest -q "$@"
