#!/usr/bin/env bash
# Regenerates every committed tune check (tune-check*.json and .md) with the current check tool:
#   bash bench/results/regen-checks.sh [PYTHON]
# Each runs from the folder its recorded table paths are relative to, as it was first written.
set -euo pipefail
PY=${1:-python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
check() {  # DIR TUNE SCHEDULE-SERVER OUT [--served TUNE] SPEED...
  local dir=$1 tune=$2 server=$3 out=$4; shift 4
  local extra=()
  if [ "${1:-}" = --served ]; then extra=(--served "$2"); shift 2; fi
  for s in "$@"; do extra+=(--speed "$s"); done
  (cd "$ROOT/$dir" && PYTHONPATH="$ROOT" "$PY" -m proving_ground.tuning --tune "$tune" "${extra[@]}" \
      --schedule-server "$server" --out "$out" > /dev/null)
}
R=bench/results
check $R 2026-12-01-wide-weak-schedule-bench-costs/wide-tune/tune.json ddtree-stuned-weak-spine 2026-12-01-wide-weak-schedule-bench-costs/tune-check.json \
  2026-12-01-wide-weak-schedule-bench-costs/wide-speed/e2e-runwide-speed.json
check $R 2026-12-01-wide-weak-schedule-steady-costs/wide-tune/tune.json ddtree-stuned-weak-spine 2026-12-01-wide-weak-schedule-steady-costs/tune-check.json \
  2026-12-01-wide-weak-schedule-steady-costs/wide-speed/e2e-runwide-speed.json
check $R 2026-12-01-wide-weak-schedule-steady-costs/wide-tune/tune.json ddtree-stuned-weak-spine 2026-12-01-wide-weak-schedule-steady-costs/tune-check-recheck.json \
  2026-12-01-wide-weak-schedule-steady-costs/wide-recheck/e2e-runwide-recheck.json
check $R 2026-12-01-tiny-tune-both-drafters/tiny-tune/weak/tune.json ddtree-stunedweak-weak-spine 2026-12-01-tiny-tune-both-drafters/tune-check-weak.json \
  2026-12-01-tiny-tune-both-drafters/tiny-speed-weak/e2e-runtiny-speed-weak.json
check $R 2026-12-01-tiny-tune-both-drafters/tiny-tune/real/tune.json ddtree-stunedreal-real-spine 2026-12-01-tiny-tune-both-drafters/tune-check-real.json \
  2026-12-01-tiny-tune-both-drafters/tiny-speed-real/e2e-runtiny-speed-real.json
for t in wide-speed-mid wide-speed-mid-2; do
  check $R/2026-12-01-wide-mid-schedule wide-tune-mid/tune/mid/tune.json ddtree-stunedmid-mid-spine tune-check-$t.json \
    $t/e2e-runwide-speed-mid.json
done
check $R/2026-12-01-wide-mid-schedule wide-tune-mid/tune/mid/tune.json ddtree-stunedmid-mid-spine tune-check-pooled.json \
  wide-speed-mid/e2e-runwide-speed-mid.json wide-speed-mid-2/e2e-runwide-speed-mid.json
S8=$R/2026-12-01-wide-mid-schedule-cost-rounds
for t in wide-speed-mid wide-speed-mid-2; do
  check . $S8/wide-tune-mid/tune/mid/tune.json ddtree-stunedmid-mid-spine $S8/tune-check-$t.json \
    $S8/$t/e2e-runwide-speed-mid.json
done
check . $S8/wide-tune-mid/tune/mid/tune.json ddtree-stunedmid-mid-spine $S8/tune-check-pooled.json \
  $S8/wide-speed-mid/e2e-runwide-speed-mid.json $S8/wide-speed-mid-2/e2e-runwide-speed-mid.json
S9=$R/2026-12-01-wide-weak-schedule-cost-rounds
for t in wide-speed wide-speed-2; do
  check . $S9/wide-tune/tune/weak/tune.json ddtree-stuned-weak-spine $S9/tune-check-$t.json $S9/$t/e2e-runwide-speed.json
done
check . $S9/wide-tune/tune/weak/tune.json ddtree-stuned-weak-spine $S9/tune-check-pooled.json \
  $S9/wide-speed/e2e-runwide-speed.json $S9/wide-speed-2/e2e-runwide-speed.json
S10=$R/2026-12-02-wide-weak-costs-inside-table
T10=$S10/wide-tune/tune/weak/tune.json
check . $T10 ddtree-stuned-weak-spine $S10/tune-check-wide-speed.json $S10/wide-speed/e2e-runwide-speed.json
check . $T10 ddtree-stuned-weak-spine $S10/tune-check-wide-speed-costed.json \
  $S10/wide-speed-costed/e2e-runwide-speed-costed.json
check . $T10 ddtree-stuned-weak-spine $S10/tune-check-pooled.json $S10/wide-speed/e2e-runwide-speed.json \
  $S10/wide-speed-costed/e2e-runwide-speed-costed.json
# The served schedule (call 1's tune) predicted by the tune on the costs measured inside the table.
check . $S10/wide-speed-costed/tune/weak-table/tune.json ddtree-stuned-weak-spine $S10/tune-check-costed.json \
  --served $T10 $S10/wide-speed-costed/e2e-runwide-speed-costed.json
