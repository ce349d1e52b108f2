#!/usr/bin/env bash
# Regenerate the hashed lock files from the exact pins in pyproject.toml: `bash scripts/lock.sh`
# (after changing a pin). Pins not named in pyproject.toml keep their locked version unless
# `bash scripts/lock.sh --upgrade` is asked for. Resolved for CPython 3.11 on Linux x86_64.
#   requirements/lock.txt             dependencies + the test extra (scripts/test.sh)
#   requirements/runtime.txt          dependencies only, same versions as lock.txt (Dockerfile)
#   requirements/bench.txt            dependencies + the bench extra, same versions as lock.txt
#   requirements/build.txt            the build backend (setuptools, wheel) for building the wheel
#   requirements/uv.txt               the resolver this script runs (uv)
#   tests/packaging/openai-agents.lock openai-agents and its dependencies, same versions as lock.txt
#                                      (tests/test_packaging.py installs it beside Pluto's wheel)
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
SETUPTOOLS_VERSION=84.2.1       # pyproject.toml [build-system] requires setuptools>=68 and wheel
WHEEL_VERSION=0.48.0
OPENAI_AGENTS_VERSION=0.20.0    # the newest release that accepts openai<3 (litellm needs openai 2.x)

if [ -f requirements/uv.txt ]; then
  python3 -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements/uv.txt
else
  python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi

compile() {
  python3 -m uv pip compile --quiet --generate-hashes \
    --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
    --custom-compile-command "bash scripts/lock.sh" "$@"
}
EXTRA=("$@")   # e.g. --upgrade, --upgrade-package NAME

mkdir -p requirements tests/packaging
compile "${EXTRA[@]}" pyproject.toml --extra test -o requirements/lock.txt
compile "${EXTRA[@]}" pyproject.toml -c requirements/lock.txt -o requirements/runtime.txt
compile "${EXTRA[@]}" pyproject.toml --extra bench -c requirements/lock.txt -o requirements/bench.txt
printf 'setuptools==%s\nwheel==%s\n' "$SETUPTOOLS_VERSION" "$WHEEL_VERSION" \
  | compile "${EXTRA[@]}" - -o requirements/build.txt
printf 'uv==%s\n' "$UV_VERSION" | compile "${EXTRA[@]}" - -o requirements/uv.txt
printf 'openai-agents==%s\n' "$OPENAI_AGENTS_VERSION" \
  | compile "${EXTRA[@]}" - -c requirements/lock.txt -o tests/packaging/openai-agents.lock
echo "scripts/lock.sh: requirements/*.txt and tests/packaging/openai-agents.lock are up to date"
