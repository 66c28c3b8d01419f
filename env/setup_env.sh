#!/usr/bin/env bash
# Install the pinned k26-ddtree stack on this machine: on a GPU box the CUDA 13.0 toolkit,
# python dev headers, aria2 and a venv with torch + sglang + this toolkit, at the pins of the
# --sglang version (k26_ddtree/repro/sglang_versions.py; an unknown version is refused);
# without GPUs, sglang's sources without its CUDA stack. Idempotent; --dry-run lists the steps.
#
# The plan lives in k26_ddtree/repro/setup.py (also `k26-deploy setup`); this script runs it
# with the system python because no venv exists yet on a fresh machine.
#   bash env/setup_env.sh [--venv PATH] [--python PY] [--gpu auto|yes|no] [--sglang VERSION] [--dry-run]
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}

if ! command -v "$PY" >/dev/null 2>&1; then
  echo "setup_env.sh: error: $PY not found; install Python 3.10-3.13 first (Ubuntu: apt-get install python3)" >&2
  exit 2
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "setup_env.sh: error: $PY is $("$PY" -V 2>&1); setup needs Python 3.10-3.13 (set PYTHON=/path/to/python3.12)" >&2
  exit 2
fi
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m k26_ddtree.repro.setup "$@"
