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
# Any torch >= 2.4 runs the CPU suite; a venv that has one (a GPU box's 2.11) keeps it. A new venv
# gets 2.13.0, which the CI machines carry as a local CPU wheel (the newest release the index
# offers is a multi-GB CUDA build).
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "tests/run.sh: installing torch 2.13.0 into .venv"
  .venv/bin/python -m pip install -q torch==2.13.0 || exit 1
fi
echo "tests/run.sh: installing the toolkit and test requirements into .venv"
.venv/bin/python -m pip install -q -r env/requirements-test.txt -r env/requirements-sglang-cpu.txt || exit 1
.venv/bin/python -m pip install -q -e '.[test]' || exit 1

# The pinned SGLang wheel is downloaded once per run (not across runs) and shared by the tests.
K26_WHEEL_CACHE=$(mktemp -d "${PWD}/.cache/wheels.XXXXXX" 2>/dev/null || { mkdir -p .cache && mktemp -d "${PWD}/.cache/wheels.XXXXXX"; })
export K26_WHEEL_CACHE
trap 'rm -rf "$K26_WHEEL_CACHE"' EXIT

.venv/bin/python -m pytest -q -ra "$@"
