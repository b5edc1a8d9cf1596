#!/bin/sh
# Debian's headless-capable chromium and its WebDriver, for tests/test_dashboard.py (run by `make test`).
set -e
if command -v chromedriver >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver
