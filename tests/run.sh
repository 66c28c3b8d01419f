#!/usr/bin/env bash
# The whole CPU test suite, as README.md states and .ci/run calls.
# Runs in venvs of its own, .cache/test-venv (and .cache/test-venv-0.5.17, below), never the quick
# start's .venv: that one holds the pinned sglang (patched), which tests that need "no sglang
# installed" must not see, and the suite must give the same answer before and after
# `bash env/quickstart.sh`. Creates the venvs when missing, installs the toolkit and its test
# needs into them, then runs pytest. Extra arguments go to pytest.
set -u -o pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
V17=tests/sglang_cpu/v0_5_17
# Reads SGLang's own parser of the process's version (K26_SGLANG_VERSION): the full run runs it in both.
V17_TOO=tests/deploy/test_deploy_sglang_parser.py

# make_venv VENV SGLANG_REQUIREMENTS: the venv with torch, the toolkit and the test needs.
make_venv() {
  local venv=$1 torch
  if [ ! -x "$venv/bin/python" ]; then
    echo "tests/run.sh: creating $venv"
    mkdir -p .cache && "$PY" -m venv "$venv" || return 1
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null || return 1
  # Any torch >= 2.4 runs the CPU suite; a venv that has one keeps it. A new venv gets the release
  # the CI machines carry as a local CPU wheel (the newest release the index offers is a multi-GB
  # CUDA build): setup's CPU fallback, read from the checkout (setup.py is standard library only).
  if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    torch=$("$venv/bin/python" -c "from k26_ddtree.repro.setup import CPU_TORCH_FALLBACK; print(CPU_TORCH_FALLBACK)") \
      || return 1
    echo "tests/run.sh: installing torch $torch into $venv"
    "$venv/bin/python" -m pip install -q "torch==$torch" || return 1
  fi
  echo "tests/run.sh: installing the toolkit and test requirements into $venv"
  "$venv/bin/python" -m pip install -q -r env/requirements-test.txt -r "$2" || return 1
  "$venv/bin/python" -m pip install -q -e '.[test]' || return 1
}

# SGLang 0.5.17's tests ($V17) import its sources, which need other releases than 0.5.11's
# (transformers among them): a venv and a process of their own, run after the rest. Arguments
# that name a path under $V17 run that process alone with them; other arguments, the rest alone.
main=1 v17=1
for arg in "$@"; do
  case $arg in
    "$V17"*) main=0 ;;
    -*) ;;
    *) v17=0 ;;
  esac
done
if [ "$main" = 0 ]; then v17=1; fi
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

status=0
if [ "$main" = 1 ]; then
  make_venv .cache/test-venv env/requirements-sglang-cpu.txt || exit 1
  .cache/test-venv/bin/python -m pytest -q -ra "$@" || status=$?
fi
if [ "$v17" = 1 ]; then
  echo "tests/run.sh: SGLang 0.5.17's tests ($V17)"
  make_venv .cache/test-venv-0.5.17 env/requirements-sglang-cpu-0.5.17.txt || exit 1
  if [ "$main" = 1 ]; then set -- "$@" "$V17" "$V17_TOO"; fi
  K26_SGLANG_VERSION=0.5.17 .cache/test-venv-0.5.17/bin/python -m pytest -q -ra "$@" || status=$?
fi
exit "$status"
