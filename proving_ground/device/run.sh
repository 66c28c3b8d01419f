#!/usr/bin/env bash
# One proving-ground run on a GPU box with no network: bash proving_ground/device/run.sh RUN
#   RUN: a run in proving_ground/device/matrix.json: prove, speed-weak, speed-real (the speed tables), the
#   lossless matrix runs 1, 2, 3 (23: runs 2 and 3 at once), final, profile, validate, or the tune runs.
# Reads .gpu/ (carried): k26-site-py3.12-sm90.tar.xz (required); model.tar.xz, jit-cache.tar.xz and
# oracle.json (optional: without model.tar.xz the model pairs are trained here and written to
# $OUT/model.tar.xz; without oracle.json the -oracle servers start after this run's AR reference).
# A machine that ran an earlier run still has /tmp/k26 and the servers that run kept (K26_E2E_ARGS="--keep-for RUN"): the installed site, the models and the JIT
# caches are then reused as they are, and so are those servers.
# Writes under $OUT (default ./gpu-out), at most 8 files (a run that trains, with K26_GPU_STATE=1, 9):
# e2e-runRUN.json/.md (the JSON also holds the models' train report and offline acceptance table),
# speed-runRUN.md for a speed run, logs-runRUN.tar.xz, oracle-runRUN.json, jit-cache.tar.xz, run.log
# (graph_check's output included when it trained), gpu-state-runRUN.csv with K26_GPU_STATE=1, and
# model.tar.xz when it trained.
# K26_WIDE=1 serves the widened target instead (the pair's target widened here, K26_WIDEN_ARGS).
# K26_BOX=NAME serves the K2.6 cost emulator of box NAME (proving_ground/emulator/boxes/NAME.json).
# K26_REDRAFT=1 trains every drafter anew against the carried target first (model.tar.xz back).
# K26_SITE_SGLANG=VERSION: the bundle in $G is that SGLang version's; it is installed as
# /tmp/k26/site-sglangVERSION beside the default site an earlier call installed, and serves the
# servers named -sglangVERSION (K26_GPU_DIR names the folder that carries it).
set -uo pipefail
RUN=${1:?usage: bash proving_ground/device/run.sh RUN}
OUT=${OUT:-$PWD/gpu-out}
G=${K26_GPU_DIR:-.gpu}
K=/tmp/k26
JIT=/tmp/k26-jit
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$K"
exec > >(tee -a "$OUT/run.log") 2>&1
step() { echo "[run.sh $(date +%H:%M:%S) +${SECONDS}s] $*"; }

# install_site SITE: the bundle carried in $G installed as SITE, unless a warm machine has it there.
install_site() {
  local site=$1 archive sha
  archive=$(ls "$G"/k26-site-py3.12-sm90*.tar.xz 2>/dev/null)
  sha=$(cut -d' ' -f1 "$archive.sha256" 2>/dev/null)
  [ "$(printf '%s\n' "$archive" | grep -c .)" = 1 ] && [ -n "$sha" ] || {
    echo "run.sh: $G must hold one k26-site-py3.12-sm90*.tar.xz and its .sha256 (build the bundle: docs/proving-ground.md)"; exit 2; }
  if [ "$(cat "$site/.k26-bundle" 2>/dev/null)" = "$sha" ]; then
    step "offline bundle already installed (warm machine): reusing $site"
  else
    step "install the offline bundle $(basename "$archive") as $site"
    rm -rf "$K/k26-bundle" "$site"
    tar -xJf "$archive" -C "$K" || exit 1
    sh "$K/k26-bundle/install.sh" "$site" || exit 1
    echo "$sha" > "$site/.k26-bundle"
  fi
  step "refresh k26_ddtree in $site from this working tree, with the proving ground beside it (its test-only hooks load by dotted path)"
  rm -rf "$site/k26_ddtree"
  python3 -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from k26_ddtree.repro import bundle; bundle.copy_self(Path('$site'))" || exit 1
  rm -rf "$site/proving_ground" && cp -r proving_ground "$site/proving_ground" || exit 1
}
if [ -n "${K26_SITE_SGLANG:-}" ]; then
  # The carried bundle is another SGLang version's, served beside the default one's: that one
  # (the pair's training, AR, and servers without -sglangVERSION) must be here from an earlier call.
  [ -f "$K/site/.k26-bundle" ] || {
    echo "run.sh: K26_SITE_SGLANG=$K26_SITE_SGLANG needs the default bundle installed by an earlier call on this machine"; exit 2; }
  install_site "$K/site-sglang$K26_SITE_SGLANG"
  step "default site (warm machine): reusing $K/site"
else
  install_site "$K/site"
fi
export PYTHONPATH=$K/site

if [ -d "$JIT" ]; then step "JIT caches already here (warm machine)";
elif [ -f "$G/jit-cache.tar.xz" ]; then step "restore JIT caches"; mkdir -p "$JIT"; tar -xJf "$G/jit-cache.tar.xz" -C "$JIT"; fi
CHECK_PID=
# The models folder records where it came from (the SHA256 of the archive carried or, when it
# trained, packed), so a newly carried archive replaces what an earlier call left on a warm
# machine, and carrying back the archive a call packed keeps its pair and the servers kept on it.
# What it must hold: that pair, or with K26_REDRAFT=1 its target and drafters trained anew against
# it, which a warm machine keeps for later K26_REDRAFT=1 calls. A call that carries no archive
# (one carrying another SGLang's bundle among them) serves the pair on this machine as it is,
# redrafted or not, since servers kept beside may run on it; K26_REDRAFT=1 still redrafts it.
HAVE_MODEL=$(cat "$K/models/.k26-model" 2>/dev/null)
[ -f "$K/models/train_report.json" ] || HAVE_MODEL=
MODEL_SHA=trained
if [ -f "$G/model.tar.xz" ]; then MODEL_SHA=$(sha256sum "$G/model.tar.xz" | cut -d' ' -f1)
elif [ -n "$HAVE_MODEL" ]; then MODEL_SHA=${HAVE_MODEL%% *}; fi
want_model() {
  if [ "${K26_REDRAFT:-0}" = 1 ]; then echo "$MODEL_SHA redrafted"
  elif [ ! -f "$G/model.tar.xz" ] && [ -n "$HAVE_MODEL" ]; then echo "$HAVE_MODEL"
  else echo "$MODEL_SHA"; fi
}
WANT_MODEL=$(want_model)
if [ -n "$HAVE_MODEL" ] && { [ "$HAVE_MODEL" = "$WANT_MODEL" ] || [ "$HAVE_MODEL" = "$MODEL_SHA" ]; }; then
  step "model pairs already here (warm machine)"
elif [ -f "$G/model.tar.xz" ]; then
  step "unpack the model pairs"; rm -rf "$K/models"; mkdir -p "$K/models"
  tar -xJf "$G/model.tar.xz" -C "$K/models" || exit 1
  echo "$MODEL_SHA" > "$K/models/.k26-model"
else
  # The step graphs and kernels are checked beside the training: a failure there ends the run
  # before any server starts.
  step "graph_check in the background; make the model pairs (corpus, tokenizer, training)"
  # Beside them, a small pair made twice and compared: whether this machine's training is
  # deterministic, so that the same recipe on a later call makes the same pair (pair_sha256).
  python3 proving_ground/device/graph_check.py > "$K/graph_check.txt" 2>&1 &
  CHECK_PID=$!
  python3 -m proving_ground.train --out "$K/determinism" --check-determinism > "$K/determinism.txt" 2>&1 &
  DETERMINISM_PID=$!
  rm -rf "$K/models"
  python3 -m proving_ground.train --out "$K/models" --time-budget "${K26_TRAIN_BUDGET:-480}" || exit 1
  tar -C "$K/models" -cf - . | xz -T0 -3 > "$OUT/model.tar.xz"
  MODEL_SHA=$(sha256sum "$OUT/model.tar.xz" | cut -d' ' -f1); WANT_MODEL=$(want_model)
  echo "$MODEL_SHA" > "$K/models/.k26-model"
  wait "$DETERMINISM_PID"
  grep -E "determinism:|Warning|Error" "$K/determinism.txt" | sort | uniq -c | head -20
fi
step "the pair: $(python3 -c "import json; r = json.load(open('$K/models/train_report.json')); print('pair_sha256', r.get('pair_sha256'), 'reproducible', r.get('reproducible'))")"
if [ "$(cat "$K/models/.k26-model")" != "$WANT_MODEL" ]; then
  # Every drafter trained anew against the pair's target (train --redraft); the archive comes back.
  step "redraft: every drafter trained anew against the carried target"
  python3 -m proving_ground.train --out "$K/models" --redraft --time-budget "${K26_TRAIN_BUDGET:-480}" || exit 1
  tar -C "$K/models" --exclude=.k26-model -cf - . | xz -T0 -3 > "$OUT/model.tar.xz"
  echo "$WANT_MODEL" > "$K/models/.k26-model"
fi
if [ -z "$CHECK_PID" ] && [ "${K26_GRAPH_CHECK:-0}" = 1 ]; then
  # Asked for beside a run that does not train: checked while the servers start, reported at the end.
  python3 proving_ground/device/graph_check.py > "$K/graph_check.txt" 2>&1 &
  LATE_CHECK_PID=$!
fi
MODELS=$K/models
if [ "${K26_WIDE:-0}" = 1 ]; then
  # The widened target (proving_ground.widen): the trained target's text with a wider, slower MLP.
  WIDEN_KEY="$MODEL_SHA ${K26_WIDEN_ARGS:-}"
  if [ -f "$K/models-wide/widen_report.json" ] && [ "$(cat "$K/models-wide/.k26-widen" 2>/dev/null)" = "$WIDEN_KEY" ]; then
    step "widened target already here (warm machine)"
  else
    step "widen the target"; rm -rf "$K/models-wide"
    python3 -m proving_ground.widen --models "$K/models" --out "$K/models-wide" ${K26_WIDEN_ARGS:-} || exit 1
    echo "$WIDEN_KEY" > "$K/models-wide/.k26-widen"
  fi
  cat "$K/models-wide/widen_report.json"
  MODELS=$K/models-wide
fi
if [ -n "${K26_BOX:-}" ]; then
  # The K2.6 cost emulator (proving_ground/emulator): the same pair, its target's forward made to
  # cost what one rank of the box spends. subtract_us is what the pair already spends per step
  # that the box's step would hide. An AR step overlaps its host time with the previous step's GPU
  # work, so only the target's own kernels count (about 150 us of the profiled spec step's 430,
  # bench/results/2026-11-30-decode-step-profiles). SGLang 0.5.11's DFlash worker does not
  # overlap: its plain-pair step, host included, takes 4180 us at C=1 (1004 tok/s at acceptance
  # 4.20, bench/results/2026-12-01-tiny-tree-vs-chain-speed). 0.5.17's overlap worker hides the
  # host behind a step as long as the box's, so only the pair's GPU work counts: about 500 us
  # (the same profiles' spec step).
  SERVED_SGLANG=$(cd / && python3 -c "import importlib.metadata as m; print(m.version('sglang'))") || exit 1
  case $SERVED_SGLANG in
    0.5.11) VERIFY_US=4180 ;;
    *) VERIFY_US=500 ;;
  esac
  SUBTRACT=${K26_SUBTRACT:---subtract-decode-us 150 --subtract-verify-us $VERIFY_US}
  EMU=$K/models-$K26_BOX
  EMU_KEY="$MODEL_SHA $K26_BOX $SUBTRACT $(cat proving_ground/emulator/boxes/"$K26_BOX".json proving_ground/emulator/calibration.py | sha256sum | cut -c1-16)"
  if [ -f "$EMU/target/config.json" ] && [ "$(cat "$EMU/.k26-emulated" 2>/dev/null)" = "$EMU_KEY" ]; then
    step "emulated $K26_BOX folder already here (warm machine)"
  else
    step "emulate $K26_BOX: $SUBTRACT"; rm -rf "$EMU"; mkdir -p "$EMU"
    python3 -m proving_ground.emulator.folder --target "$MODELS/target" --out "$EMU/target" --box "$K26_BOX" $SUBTRACT || exit 1
    for f in "$MODELS"/*; do [ "$(basename "$f")" = target ] || ln -s "$f" "$EMU/"; done
    echo "$EMU_KEY" > "$EMU/.k26-emulated"
  fi
  MODELS=$EMU
fi
cat "$K/models/train_report.json" 2>/dev/null
if [ -n "$CHECK_PID" ]; then
  wait "$CHECK_PID"; check_rc=$?
  cat "$K/graph_check.txt"
  if [ "$check_rc" -ne 0 ]; then step "graph_check failed (exit $check_rc): no servers started"; exit 1; fi
fi

# K26_GPU_STATE=1: the card's clocks, power and load once a second beside the run (repeats carry
# their start times), to read off whether a table's drift is the card's own. Off by default: a
# measurement runs with nothing else querying the driver (an H200's SM clock held 1980 MHz under load).
# It writes one more file. nvidia-smi's timestamps are the machine's local time
# (often UTC), repeat_started epoch seconds.
SMI_PID=
if [ "${K26_GPU_STATE:-0}" = 1 ]; then
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used,clocks_event_reasons.active \
      --format=csv,nounits -lms 1000 > "$OUT/gpu-state-run$RUN.csv" &
    SMI_PID=$!
    trap 'kill "$SMI_PID" 2>/dev/null' EXIT
    step "K26_GPU_STATE=1: nvidia-smi logs the card's state once a second to gpu-state-run$RUN.csv"
  else
    step "K26_GPU_STATE=1, but there is no nvidia-smi: no gpu-state file"
  fi
fi
ORACLE_ARGS=()
if [ -f "$G/oracle.json" ]; then ORACLE_ARGS=(--oracle-file "$G/oracle.json"); fi
# The runner gets what is left of K26_RUN_LIMIT (the device command's limit) minus time to stop
# servers and pack the caches, so its report is always written before the command is killed.
DEADLINE=$(( ${K26_RUN_LIMIT:-560} - SECONDS - ${K26_STOP_RESERVE:-60} ))
step "matrix run $RUN (deadline ${DEADLINE}s)"
SITE_ARGS=()
for other in "$K"/site-sglang*; do
  [ -f "$other/.k26-bundle" ] && SITE_ARGS+=(--site-for "${other##*/site-sglang}=$other")
done
python3 proving_ground/device/e2e.py --matrix proving_ground/device/matrix.json --run "$RUN" --site "$K/site" --models "$MODELS" \
  --out "$OUT" --jit-dir "$JIT" --deadline-s "$DEADLINE" "${ORACLE_ARGS[@]}" "${SITE_ARGS[@]}" ${K26_E2E_ARGS:-}
rc=$?
if [ -n "${LATE_CHECK_PID:-}" ]; then
  wait "$LATE_CHECK_PID"; check_rc=$?
  cat "$K/graph_check.txt"
  if [ "$check_rc" -ne 0 ]; then step "graph_check failed (exit $check_rc)"; rc=1; fi
fi
if [ -n "$SMI_PID" ]; then kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; fi
step "pack JIT caches"
tar -C "$JIT" -cf - . 2>/dev/null | xz -T0 -6 > "$OUT/jit-cache.tar.xz"
size=$(stat -c %s "$OUT/jit-cache.tar.xz" 2>/dev/null || echo 0)
if [ "$size" -gt 16000000 ]; then step "jit-cache.tar.xz is $size bytes: too big to come back, dropped"; rm -f "$OUT/jit-cache.tar.xz"; fi
du -sh "$JIT"/* 2>/dev/null
step "done (e2e exit $rc)"
exit $rc
