#!/usr/bin/env bash
# Install Pluto with its test dependencies, then run the whole test suite.
# Used by the README's second command and by CI (.ci/run). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dependencies from the hashed lock (exact versions; `bash scripts/lock.sh` regenerates it),
# then Pluto itself, editable, without letting pip resolve anything else.
bash scripts/install.sh test
# The browser test drives Debian's Chromium (never a downloaded one: no `playwright install`).
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "scripts/test.sh: /usr/bin/chromium is missing; install it: apt-get install -y chromium" >&2
    SUDO=none
  fi
  if [ "$SUDO" != none ]; then
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
  fi
fi
exec python3 -m pytest "$@"
