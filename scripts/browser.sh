#!/usr/bin/env bash
# Make sure a headless Chromium is available for the HTML report test (Debian's `chromium` package).
# Installs it with apt-get when missing and this user may (root); otherwise says how, and the test skips.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium for the HTML report test (apt-get)…" >&2
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "no chromium: install it (apt-get install chromium) to run the HTML report's browser test" >&2
fi
