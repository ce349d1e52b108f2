#!/usr/bin/env bash
# Install Pluto from the hashed lock files: exact versions, checked by hash, nothing resolved.
#   bash scripts/install.sh          the gateway (requirements/runtime.txt)
#   bash scripts/install.sh test     and the test tools (requirements/lock.txt)
#   bash scripts/install.sh bench    and the benchmark tools (requirements/bench.txt)
# `bash scripts/lock.sh` regenerates the locks after a change of pins in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-runtime}" in
  runtime) lock=requirements/runtime.txt ;;
  test) lock=requirements/lock.txt ;;
  bench) lock=requirements/bench.txt ;;
  *) echo "usage: bash scripts/install.sh [runtime|test|bench]" >&2; exit 2 ;;
esac
pip=(python3 -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --require-hashes -r requirements/build.txt -r "$lock"
# Pluto itself, editable, built with the locked setuptools, resolving nothing more.
"${pip[@]}" --no-deps --no-build-isolation -e .
