"""`python -m proving_ground`: the runner's flags."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from pathlib import Path

from k26_ddtree.errors import UserError
from proving_ground.e2e.extras import PROFILE_STEPS
from proving_ground.e2e.run import MatrixRun


def sites_by_version(parser: argparse.ArgumentParser, given: list[str]) -> dict[str, Path]:
    """{SGLang version: site folder} from --site-for VERSION=DIR; a malformed one ends the run at once."""
    sites: dict[str, Path] = {}
    for text in given:
        version, sep, folder = text.partition("=")
        if not (sep and re.fullmatch(r"\d+\.\d+\.\d+", version) and folder):
            parser.error(f"--site-for {text!r}: expected VERSION=DIR, e.g. 0.5.17=/tmp/k26/site-sglang0.5.17")
        if version in sites:
            parser.error(f"--site-for: sglang {version} given twice")
        if not Path(folder).is_dir():
            parser.error(f"--site-for {text!r}: {folder} is not a folder")
        sites[version] = Path(folder).resolve()
    return sites


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving_ground",
                                     description="The GPU proving-ground runner: real sglang servers, one matrix run, "
                                     "one JSON + markdown table (docs/proving-ground.md).")
    parser.add_argument("--matrix", type=Path, required=True, help="proving_ground/device/matrix.json")
    parser.add_argument("--run", required=True, help="which run of the matrix (its \"runs\" keys)")
    parser.add_argument("--site", type=Path, required=True, help="installed offline bundle (PYTHONPATH folder)")
    parser.add_argument("--models", type=Path, required=True, help="folder with target/, drafter/, prompts.json")
    parser.add_argument("--out", type=Path, required=True, help="where e2e-runN.json/.md and the logs tarball go")
    parser.add_argument("--work", type=Path, default=Path("/tmp/k26-e2e"), help="scratch: logs, oracle.json")
    parser.add_argument("--jit-dir", type=Path, default=Path("/tmp/k26-jit"), help="persisted JIT caches")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the servers")
    parser.add_argument("--base-port", type=int, default=31000)
    parser.add_argument("--only", action="append", help="restrict to these server names (ar always runs)")
    parser.add_argument("--seed", type=int, default=0, help="seed written into the oracle file")
    parser.add_argument("--rank-policy", default="mixed", help="rank policy written into the oracle file")
    parser.add_argument("--deadline-s", type=float, default=480.0,
                        help="wall seconds for the whole run: later work is cut off and reported, and the "
                        "report is always written (default 480)")
    parser.add_argument("--patched-site", type=Path, help="a site with the DDTree patch set already applied "
                        "(default: copy --site and run `python -m k26_ddtree apply` on the copy)")
    parser.add_argument("--site-for", action="append", default=[], metavar="VERSION=DIR",
                        help="the installed bundle of another SGLang version, for servers named -sglangVERSION "
                        "(repeatable; their DDTREE servers run from a patched copy, as --site's do)")
    parser.add_argument("--oracle-file", type=Path, help="an earlier run's oracle-runN.json (same model): "
                        "lets -oracle servers start with the others instead of after this run's AR")
    parser.add_argument("--bench-server", action="append", default=[],
                        help="also run `k26-deploy bench` against this server once its cells are done "
                        "(repeatable; results in OUT/bench-harness/)")
    parser.add_argument("--profile-server", action="append", default=[],
                        help=f"also record and summarise a torch-profiler trace of {PROFILE_STEPS} decode steps "
                        "on this server, NAME or NAME@C for C requests at once (repeatable; OUT/profile-NAME.txt, "
                        "OUT/profile-NAME-cC.txt)")
    parser.add_argument("--schedule", action="append", default=[], metavar="NAME=SCHEDULE",
                        help="a batch-size schedule for ddtree-sNAME-... servers: its text, or @FILE for the "
                        "schedule of a `k26-deploy tune` file (repeatable; beside matrix.json \"schedules\")")
    parser.add_argument("--cost-seconds", type=float, default=3.0, metavar="S",
                        help="each cost repeat's closed loop lasts at least S seconds (bench --steady; default 3, "
                        "the speed table's repeat)")
    parser.add_argument("--cost-repeats", type=int, default=3, metavar="N",
                        help="each cost is the median of N rounds across the cost servers, one closed loop per "
                        "server and concurrency each (default 3, not the speed table's 5, so that seven cost "
                        "servers fit one run beside the trace cells)")
    parser.add_argument("--keep-for", action="append", default=[], metavar="RUN",
                        help="leave running the servers matrix run RUN also starts, for a later run on the "
                        "same warm machine to reuse (recorded in WORK/servers.json; repeatable)")
    args = parser.parse_args(argv)
    if args.cost_repeats < 1 or not args.cost_seconds > 0:
        parser.error("--cost-repeats must be >= 1 and --cost-seconds > 0")
    args.site_for = sites_by_version(parser, args.site_for)
    # The device command's `timeout` sends SIGTERM: unwind through run()'s finally, so servers are
    # recorded or stopped and the report is written.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        report = MatrixRun(args).run()
    except UserError as err:
        print(f"e2e: error: {err}", file=sys.stderr)
        return err.code
    return 0 if report["overall"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
