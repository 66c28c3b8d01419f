#!/usr/bin/env bash
# One proving-ground run on a GPU box with no network: bash tests/gpu/run.sh RUN
#   RUN: a run in tests/gpu/matrix.json: 1, 2, 3 (23: runs 2 and 3 at once), final, profile,
#   or validate (AR + DFLASH only).
# Reads .gpu/ (carried): k26-site-py3.12-sm90.tar.xz (required); model.tar, jit-cache.tar.xz and
# oracle.json (optional: without model.tar the model pair is trained here and written to $OUT/model.tar;
# without oracle.json the -oracle servers start after this run's AR reference).
# Writes under $OUT (default ./gpu-out): e2e-runRUN.json/.md, logs-runRUN.tar.xz, oracle-runRUN.json,
# jit-cache.tar.xz, run.log (and model.tar when it trained).
set -uo pipefail
RUN=${1:?usage: bash tests/gpu/run.sh RUN}
OUT=${OUT:-$PWD/gpu-out}
G=${K26_GPU_DIR:-.gpu}
K=/tmp/k26
JIT=/tmp/k26-jit
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$K"
exec > >(tee -a "$OUT/run.log") 2>&1
step() { echo "[run.sh $(date +%H:%M:%S) +${SECONDS}s] $*"; }

step "install the offline bundle"
rm -rf "$K/k26-bundle" "$K/site" "$K/site-ddtree"
tar -xJf "$G"/k26-site-py3.12-sm90.tar.xz -C "$K" || exit 1
sh "$K/k26-bundle/install.sh" "$K/site" || exit 1
export PYTHONPATH=$K/site
step "refresh k26_ddtree in the site from this working tree"
rm -rf "$K/site/k26_ddtree"
python3 -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from k26_ddtree.gpu import bundle; bundle.copy_self(Path('$K/site'))" || exit 1

if [ -f "$G/jit-cache.tar.xz" ]; then step "restore JIT caches"; mkdir -p "$JIT"; tar -xJf "$G/jit-cache.tar.xz" -C "$JIT"; fi
if [ -f "$G/model.tar" ]; then
  step "unpack the model pair"; mkdir -p "$K/models"; tar -xf "$G/model.tar" -C "$K/models" || exit 1
else
  step "make the model pair (corpus, tokenizer, training)"
  python3 -m k26_ddtree.gpu.train --out "$K/models" --time-budget "${K26_TRAIN_BUDGET:-120}" || exit 1
  tar -cf "$OUT/model.tar" -C "$K/models" .
fi
cat "$K/models/train_report.json" 2>/dev/null

ORACLE_ARGS=()
if [ -f "$G/oracle.json" ]; then ORACLE_ARGS=(--oracle-file "$G/oracle.json"); fi
# The runner gets what is left of K26_RUN_LIMIT (the device command's limit) minus time to stop
# servers and pack the caches, so its report is always written before the command is killed.
DEADLINE=$(( ${K26_RUN_LIMIT:-560} - SECONDS - 60 ))
step "matrix run $RUN (deadline ${DEADLINE}s)"
python3 tests/gpu/e2e.py --matrix tests/gpu/matrix.json --run "$RUN" --site "$K/site" --models "$K/models" \
  --out "$OUT" --jit-dir "$JIT" --deadline-s "$DEADLINE" "${ORACLE_ARGS[@]}" ${K26_E2E_ARGS:-}
rc=$?
step "pack JIT caches"
tar -C "$JIT" -cf - . 2>/dev/null | xz -T0 -6 > "$OUT/jit-cache.tar.xz"
size=$(stat -c %s "$OUT/jit-cache.tar.xz" 2>/dev/null || echo 0)
if [ "$size" -gt 16000000 ]; then step "jit-cache.tar.xz is $size bytes: too big to come back, dropped"; rm -f "$OUT/jit-cache.tar.xz"; fi
du -sh "$JIT"/* 2>/dev/null
step "done (e2e exit $rc)"
exit $rc
