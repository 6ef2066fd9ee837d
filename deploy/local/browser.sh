#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the console's browser test (tests/console), from Debian's
# packages. Prints two lines: the browser's path, then chromedriver's.
#
# When either is missing it runs `apt-get install -y chromium chromium-driver` (needs root; CI runs as
# root on a fresh Debian machine); otherwise it fails with a message saying what to install. The test
# fails (it does not skip) when this script fails.
set -euo pipefail

log() { echo "browser.sh: $*" >&2; }

find_browser() { command -v chromium || command -v chromium-browser || command -v google-chrome || true; }
find_driver() { command -v chromedriver || { test -x /usr/lib/chromium/chromedriver && echo /usr/lib/chromium/chromedriver; } || true; }

if [ -z "$(find_browser)" ] || [ -z "$(find_driver)" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "Chromium or chromedriver is missing: apt-get install -y chromium chromium-driver (as root)"
    exit 1
  fi
  log "installing chromium and chromium-driver with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq chromium chromium-driver >&2; then
    apt-get update -qq >&2
    apt-get install -y -qq chromium chromium-driver >&2
  fi
fi
browser="$(find_browser)"
driver="$(find_driver)"
[ -n "$browser" ] && [ -n "$driver" ] || { log "no chromium/chromedriver after installing"; exit 1; }
echo "$browser"
echo "$driver"
