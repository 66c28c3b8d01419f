"""`k26-deploy`: one argparse front, one module per subcommand family.

Each family module exposes `register(subparsers)`; every parser it adds sets
`func=handler` where `handler(args) -> int` is the exit code. Family modules
must not import torch or sglang at module level: `k26-deploy --help` stays fast
on a machine that has neither.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from k26_ddtree import __version__
from k26_ddtree.errors import UserError

FAMILIES = (
    "k26_ddtree.repro.cli",      # setup, snapshot, manifest, verify, bundle
    "k26_ddtree.patchset.cli",   # apply
    "k26_ddtree.deploy.cli",     # detect, render, install, reconfigure, status, wait-ready
    "k26_ddtree.fetch.cli",      # fetch-model, verify-model
    "k26_ddtree.bench.cli",      # bench run|report|sweep
    "k26_ddtree.tune.cli",       # tune
)

PROG = "k26-deploy"


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line for usage errors, in the same form as a UserError."""

    def error(self, message: str) -> None:  # noqa: D401
        command = self.prog.removeprefix(PROG).strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"{PROG}: error: {where}{message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=(
            "Deploy Kimi K2.6 on SGLang 0.5.11 with DFlash + DDTree: patch the pinned "
            "SGLang, render and run systemd units per hardware profile, retune "
            "budget/topk safely, benchmark, and verify a SHA256 reproduction manifest."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in FAMILIES:
        importlib.import_module(name).register(sub)
    return parser


def _terminate_as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # SIGTERM (systemd stop, kill) unwinds like Ctrl-C: context managers and `finally` blocks
    # remove temp folders, stop child processes (aria2c keeps its resume records) and keep
    # results written so far, instead of the interpreter dying mid-write.
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
