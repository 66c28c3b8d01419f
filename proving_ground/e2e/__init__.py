"""The GPU proving-ground runner: real sglang servers, one matrix run, one JSON + markdown table.

    python proving_ground/device/e2e.py --matrix proving_ground/device/matrix.json --run 1 \
        --site /tmp/k26/site --models /tmp/k26/models --out $OUT

The servers of a run share the one GPU (own port, small static memory fraction).
They start in two waves when the matrix names a first wave (its servers fill the
JIT caches the rest then load), its "last_wave" servers after all others, and
`-oracle` servers start once the `ar`
server's greedy outputs with top-2 log-probs, the reference, have become their
oracle file (K26_DDTREE_ORACLE), unless --oracle-file carries an earlier run's.
Then one workload at a time: each server's matrix cells (lossless against the
reference), or, in a speed run, the speed cells of proving_ground.speed. DDTree
servers run on a patched copy of the site (`python -m k26_ddtree apply
--sglang-dir COPY/sglang`); AR and DFLASH run on the pristine site. A run's matrix
"tunes" groups then trace, cost and tune (proving_ground.tuning). The report
is written by --deadline-s whatever happens.

Servers can outlive the run (--keep-for RUN: those a later run needs): a warm
machine keeps /tmp and session leaders between runs, so the next run
reuses every server it finds alive, healthy and started from the same bundle,
code, models and settings (WORK/servers.json, written at every launch), pays
no start-up, and stops every other server it finds recorded there.
"""

from proving_ground.e2e.cli import main

__all__ = ["main"]
