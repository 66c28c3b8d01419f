#!/usr/bin/env bash
# The whole CPU test suite, as README.md states and .ci/run calls.
# Runs in a venv of its own, .cache/test-venv, never the quick start's .venv: that one holds the
# pinned sglang (patched), which tests that need "no sglang installed" must not see, and the
# suite must give the same answer before and after `bash env/quickstart.sh`.
# Creates the venv when missing, installs the toolkit and its test needs into it, then runs
# pytest. Extra arguments go to pytest.
set -u -o pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.cache/test-venv
if [ ! -x "$VENV/bin/python" ]; then
  echo "tests/run.sh: creating $VENV"
  mkdir -p .cache && "$PY" -m venv "$VENV" || exit 1
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null || exit 1
# Any torch >= 2.4 runs the CPU suite; a venv that has one keeps it. A new venv gets the release
# the CI machines carry as a local CPU wheel (the newest release the index offers is a multi-GB
# CUDA build): setup's CPU fallback, read from the checkout (setup.py is standard library only).
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  TORCH=$("$VENV/bin/python" -c "from k26_ddtree.repro.setup import CPU_TORCH_FALLBACK; print(CPU_TORCH_FALLBACK)") \
    || exit 1
  echo "tests/run.sh: installing torch $TORCH into $VENV"
  "$VENV/bin/python" -m pip install -q "torch==$TORCH" || exit 1
fi
echo "tests/run.sh: installing the toolkit and test requirements into $VENV"
"$VENV/bin/python" -m pip install -q -r env/requirements-test.txt -r env/requirements-sglang-cpu.txt || exit 1
"$VENV/bin/python" -m pip install -q -e '.[test]' || exit 1

# The pinned SGLang wheels (one per patch set in patches/) are downloaded once per run (not across
# runs) and shared by the tests.
K26_WHEEL_CACHE=$(mktemp -d "${PWD}/.cache/wheels.XXXXXX") || exit 1
export K26_WHEEL_CACHE
trap 'rm -rf "$K26_WHEEL_CACHE"' EXIT

# The system packages some tests run for real (.ci/run installs them); without one, its tests skip.
missing=()
for need in "bubblewrap:bwrap:the coding eval's sandbox" "systemd:/lib/systemd/systemd:the unit install and reconfigure" \
            "aria2:aria2c:fetch-model" "util-linux:setpriv:runs as another user" "patch:patch:apply's diffs"; do
  IFS=: read -r package command what <<<"$need"
  command -v "$command" >/dev/null 2>&1 || missing+=("$package ($what)")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "tests/run.sh: missing system packages, so their tests skip: $(IFS=,; echo "${missing[*]}" | sed 's/,/, /g'); install with: apt-get install -y bubblewrap systemd aria2 util-linux patch"
fi

"$VENV/bin/python" -m pytest -q -ra "$@"
