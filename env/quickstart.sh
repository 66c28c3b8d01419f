#!/usr/bin/env bash
# From a fresh clone to a running k26-ddtree service (README's first command).
#
#   bash env/quickstart.sh [--profile P] [--venv PATH] [--sglang VERSION] [--set KEY=VALUE]...
#
# 1. set up the venv (env/setup_env.sh: full CUDA stack on a GPU box, sglang sources only without GPUs;
#    --sglang picks the SGLang version and its pins; an unknown one, or one known to fail on the
#    --profile's hardware, is refused before anything runs)
# 2. patch the pinned SGLang and verify it (k26-deploy apply: needs a patch set for that version)
# 3. take --profile or the one `k26-deploy detect` suggests (no GPUs: pcie-ep8, for a dry render)
# 4. render the systemd unit and validate it (k26-deploy render)
# 5. with GPUs and systemd as PID 1: install it, `systemctl start k26-ddtree` (returns once the
#    server answers /health_generate) and print its status; otherwise stop here and print the next step.
#
# No `set -e`: every step's exit code is checked where it happens, with a message naming the step.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PROFILE=""
SGLANG=""
SETS=()

usage() {
  sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
  case "$1" in
    --profile) [ $# -ge 2 ] || { echo "quickstart: error: --profile needs a value" >&2; exit 2; }; PROFILE=$2; shift 2 ;;
    --profile=*) PROFILE=${1#*=}; shift ;;
    --venv) [ $# -ge 2 ] || { echo "quickstart: error: --venv needs a path" >&2; exit 2; }; VENV=$2; shift 2 ;;
    --venv=*) VENV=${1#*=}; shift ;;
    --sglang) [ $# -ge 2 ] && [ -n "$2" ] || { echo "quickstart: error: --sglang needs a version" >&2; exit 2; }
      SGLANG=$2; shift 2 ;;
    --sglang=?*) SGLANG=${1#*=}; shift ;;
    --sglang=) echo "quickstart: error: --sglang needs a version" >&2; exit 2 ;;
    --set) [ $# -ge 2 ] || { echo "quickstart: error: --set needs KEY=VALUE" >&2; exit 2; }; SETS+=(--set "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "quickstart: error: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
# The known versions live in k26_ddtree/repro/sglang_versions.py, read with the python setup_env.sh
# uses; without one, step 1 says so.
PY=${PYTHON:-python3}
if [ -n "$SGLANG" ] && command -v "$PY" >/dev/null 2>&1; then
  if ! ERR=$(PYTHONPATH="$ROOT" "$PY" -m k26_ddtree.repro.sglang_versions "$SGLANG" 2>&1 >/dev/null); then
    echo "quickstart: $ERR" >&2
    exit 2
  fi
fi
# So does the hardware each is known to fail on: a version that fails on a shipped --profile's is
# refused here too (a profile file's `extends:` chain needs the venv: render checks it in step 4).
if [ -n "$PROFILE" ] && command -v "$PY" >/dev/null 2>&1; then
  if ! ERR=$(PYTHONPATH="$ROOT" "$PY" -m k26_ddtree.deploy.pairings ${SGLANG:+--sglang "$SGLANG"} \
               --profile "$PROFILE" 2>&1 >/dev/null); then
    echo "quickstart: $ERR" >&2
    exit 2
  fi
fi
SETUP_ARGS=(--venv "$VENV")
[ -n "$SGLANG" ] && SETUP_ARGS+=(--sglang "$SGLANG")

K26="$VENV/bin/k26-deploy"
WORK="$ROOT/.cache/quickstart"
STEP=0

step() { STEP=$((STEP + 1)); echo; echo "==> [$STEP/$TOTAL] $*"; }
fail() { echo "quickstart: error: step $STEP: $1" >&2; exit "${2:-1}"; }

HAVE_GPU=no
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  HAVE_GPU=yes
fi
HAVE_SYSTEMD=no
[ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1 && HAVE_SYSTEMD=yes
if [ "$HAVE_GPU" = yes ] && [ "$HAVE_SYSTEMD" = yes ]; then TOTAL=6; else TOTAL=5; fi

echo "k26-ddtree quick start (repository $ROOT)"
echo "  GPUs: $HAVE_GPU   systemd as PID 1: $HAVE_SYSTEMD   venv: $VENV"
echo "Plan:"
echo "  1. Set up the venv and the pinned stack        bash env/setup_env.sh ${SETUP_ARGS[*]}"
echo "  2. Patch the pinned SGLang and verify it       k26-deploy apply; k26-deploy apply --check"
echo "  3. Choose the hardware profile                 ${PROFILE:+--profile $PROFILE}${PROFILE:-k26-deploy detect (no GPUs: pcie-ep8)}"
echo "  4. Render and validate the systemd unit        k26-deploy render --profile P --allow-missing-model"
if [ "$HAVE_GPU" = yes ] && [ "$HAVE_SYSTEMD" = yes ]; then
  echo "  5. Install the unit and start the service      k26-deploy install; systemctl start k26-ddtree"
  echo "  6. Show the service status                     k26-deploy status"
else
  echo "  5. Stop before install (install and start need GPUs and systemd); print the next step"
fi

step "Set up the venv and the pinned stack"
bash "$ROOT/env/setup_env.sh" "${SETUP_ARGS[@]}" || fail "setup failed (its last lines above say which step)"
[ -x "$K26" ] || fail "setup finished but $K26 is missing"

step "Patch the pinned SGLang and verify it"
"$K26" apply || fail "k26-deploy apply failed; nothing was half-applied (see its message above)"
"$K26" apply --check || fail "the patch set is not in place after apply (k26-deploy apply --check above)"

step "Choose the hardware profile"
mkdir -p "$WORK" || fail "cannot create $WORK"
# detect prints the profile name on stdout and its reasoning on stderr; with --profile it
# checks that profile and notes when the GPUs suggest another.
DETECTED=$("$K26" detect ${PROFILE:+--profile "$PROFILE"} 2>"$WORK/detect.log")
DETECT_RC=$?
sed 's/^k26-deploy: \(error: \)\{0,1\}/  detect: /' "$WORK/detect.log"
if [ -n "$PROFILE" ]; then
  [ $DETECT_RC -eq 0 ] || fail "profile $PROFILE is not usable (reason above)" 2
  echo "profile $PROFILE (from --profile)"
elif [ $DETECT_RC -eq 0 ] && [ -n "$DETECTED" ]; then
  PROFILE=$DETECTED
  echo "profile $PROFILE (suggested by k26-deploy detect)"
elif [ "$HAVE_GPU" = no ]; then
  PROFILE=pcie-ep8
  echo "no GPUs here: using profile $PROFILE for a dry render only (pass --profile to choose another)"
else
  fail "k26-deploy detect suggests no profile for these GPUs (reason above); rerun with --profile P" 2
fi

step "Render and validate the systemd unit"
UNIT_FILE="$WORK/k26-ddtree.$(basename "$PROFILE" .yaml).service"
"$K26" render --profile "$PROFILE" --allow-missing-model "${SETS[@]}" > "$UNIT_FILE.tmp" 2>"$WORK/render.log"
RENDER_RC=$?
cat "$WORK/render.log" >&2
[ $RENDER_RC -eq 0 ] || { rm -f "$UNIT_FILE.tmp"; fail "k26-deploy render failed (message above)"; }
mv "$UNIT_FILE.tmp" "$UNIT_FILE" || fail "cannot write $UNIT_FILE"
# render checks the unit with systemd-analyze when it can, and warns on stderr when it could not
# (units.NOT_VALIDATED).
if grep -q "not validated: systemd-analyze not found" "$WORK/render.log"; then
  echo "unit rendered, not validated (systemd-analyze not found): $UNIT_FILE"
else
  echo "unit rendered and validated (systemd-analyze verify): $UNIT_FILE"
fi

if [ "$HAVE_GPU" != yes ] || [ "$HAVE_SYSTEMD" != yes ]; then
  step "Stop before install and print the next step"
  ORIGIN=$(git -C "$ROOT" remote get-url origin 2>/dev/null || echo "<this repository>")
  # The next step's folders are the rendered profile's (--set may have moved them); the drafter's
  # repository and the stack are the toolkit's own pins.
  NEXT=$("$VENV/bin/python" - "$UNIT_FILE" "$SGLANG" <<'PY'
import sys
from k26_ddtree.deploy.units import profile_from_unit
from k26_ddtree.fetch.hub import DEFAULT_DRAFTER_REPO
from k26_ddtree.repro.setup import CUDA_RELEASE
from k26_ddtree.repro.sglang_versions import pins_for
pins = pins_for(sys.argv[2] or None)
with open(sys.argv[1], encoding="utf-8") as unit:
    profile = profile_from_unit(unit.read(), sys.argv[1])
print(f"CUDA {CUDA_RELEASE} toolkit, torch {pins.torch}, sglang {pins.sglang}", profile.model, DEFAULT_DRAFTER_REPO,
      profile.drafter, sep="\n")
PY
  ) || fail "cannot read the profile back from $UNIT_FILE"
  { read -r STACK; read -r MODEL_DIR; read -r DRAFTER_REPO; read -r DRAFTER_DIR; } <<<"$NEXT"
  if [ "$HAVE_GPU" != yes ]; then
    echo "Stopped after rendering: no NVIDIA GPU here (nvidia-smi lists none), so nothing was installed or started."
  else
    echo "Stopped after rendering: systemd is not PID 1 here (a container?), so the unit cannot be installed."
  fi
  echo
  echo "NEXT STEP, on the GPU box (8x RTX PRO 6000 or 8x B300, Ubuntu 24.04, systemd):"
  echo "  git clone $ORIGIN k26-ddtree && cd k26-ddtree"
  echo "  sudo bash env/setup_env.sh${SGLANG:+ --sglang $SGLANG}             # $STACK in .venv"
  echo "  .venv/bin/k26-deploy fetch-model --dest $MODEL_DIR \\"
  echo "      --drafter $DRAFTER_REPO --drafter-dest $DRAFTER_DIR   # the weights (REPRODUCE.md step 4)"
  echo "  sudo bash env/quickstart.sh --profile $PROFILE${SGLANG:+ --sglang $SGLANG}${SETS[*]:+ ${SETS[*]}}"
  echo "Full walk-through with expected output and times: REPRODUCE.md"
  exit 0
fi

step "Install the unit and start the service"
"$K26" install --profile "$PROFILE" "${SETS[@]}" \
  || fail "k26-deploy install failed (message above; weights missing? see REPRODUCE.md step 4: k26-deploy fetch-model)"
echo "systemctl start k26-ddtree (returns when /health_generate answers 200; weight load takes minutes)"
systemctl start k26-ddtree \
  || fail "k26-ddtree did not become ready; see: journalctl -u k26-ddtree -n 200 --no-pager"

step "Show the service status"
"$K26" status || fail "k26-deploy status failed although the service started"
echo
echo "k26-ddtree is up. Next: k26-deploy bench --help, k26-deploy reconfigure --budget N --topk K"
exit 0
