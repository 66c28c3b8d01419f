#!/usr/bin/env bash
# The whole CPU test suite, as README.md states and .ci/run calls.
# Creates .venv when missing, installs the toolkit and its test needs into it,
# then runs pytest. Extra arguments go to pytest.
set -u -o pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "tests/run.sh: creating .venv"
  "$PY" -m venv .venv || exit 1
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null || exit 1
echo "tests/run.sh: installing the toolkit and test requirements into .venv"
.venv/bin/python -m pip install -q -r env/requirements-test.txt -r env/requirements-sglang-cpu.txt || exit 1
.venv/bin/python -m pip install -q -e '.[test]' || exit 1

# The pinned SGLang wheel is downloaded once per run (not across runs) and shared by the tests.
K26_WHEEL_CACHE=$(mktemp -d "${PWD}/.cache/wheels.XXXXXX" 2>/dev/null || { mkdir -p .cache && mktemp -d "${PWD}/.cache/wheels.XXXXXX"; })
export K26_WHEEL_CACHE
trap 'rm -rf "$K26_WHEEL_CACHE"' EXIT

.venv/bin/python -m pytest -q -ra "$@"
