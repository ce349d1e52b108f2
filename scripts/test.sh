#!/usr/bin/env bash
# Install Pluto with its test dependencies, then run the whole test suite.
# Used by the README's second command and by CI (.ci/run). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dependencies from the hashed lock (exact versions; `bash scripts/lock.sh` regenerates it),
# then Pluto itself, editable, without letting pip resolve anything else.
bash scripts/install.sh test
# The browser test drives Debian's Chromium (never a downloaded one: no `playwright install`);
# MCP stdio servers run inside Debian's bubblewrap (docs/security.md), and their tests need it.
missing=""
[ -x /usr/bin/chromium ] || missing="chromium"
command -v bwrap >/dev/null || missing="$missing bubblewrap"
# voice notes: ffmpeg decodes and encodes them (OGG/Opus), espeak-ng speaks answers offline
command -v ffmpeg >/dev/null || missing="$missing ffmpeg"
command -v espeak-ng >/dev/null || missing="$missing espeak-ng"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "scripts/test.sh: missing:$missing; install it: apt-get install -y$missing" >&2
    SUDO=none
  fi
  if [ "$SUDO" != none ]; then
    # shellcheck disable=SC2086  # (one word per package)
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
  fi
fi
exec python3 -m pytest "$@"
