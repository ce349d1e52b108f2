#!/usr/bin/env bash
# Install Pluto with its test dependencies, then run the whole test suite.
# Used by the README's second command and by CI (.ci/run). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
exec python3 -m pytest "$@"
