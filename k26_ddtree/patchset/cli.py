"""`k26-deploy apply`: patch the installed SGLang with its DDTree patch set, check it, or revert it."""

from __future__ import annotations

import argparse

from k26_ddtree.cli.checks import path_arg
from k26_ddtree.patchset.lock import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S

HELP = "patch the installed SGLang with DDTree (or --check / --revert)"

DESCRIPTION = """\
Patch the installed SGLang with its k26-ddtree patch set, all or nothing.

sglang is found without importing it (importlib's finder, or --sglang-dir), its
version read from the sglang-*.dist-info beside it (else sglang/_version.py).
The patch set is the shipped one for that version (patches/sglang-VERSION); a
version without one is refused, naming the versions there are patch sets for.
Every file is checked against pins.json: a different sglang version or any
file that is neither the pinned original nor the pinned patched file is
refused, naming the file, and nothing is changed. A patched file is the pinned
original with its diff applied exactly (no fuzz, no offsets), and must hash as
pins.json says before anything is staged; a diff that does not fit is refused. A file reached through a
symlink is refused too (apply replaces regular files only). Originals are kept
under <site>/.k26-ddtree-backup/sglang-VERSION/. Running apply on a patched
install says "already applied" and exits 0.

apply and --revert are each one transaction over the sglang files, the backups
and the k26_ddtree import: all of it changes or none of it. New contents and
undo copies of the old ones are staged and verified beside their targets, a
journal (<site>/.k26-ddtree.journal) records them, then they are swapped in.
A failure or SIGINT/SIGTERM part-way rolls back before exiting; after SIGKILL
or power loss the next apply or --revert finds the journal, names it and rolls
it back first (--check and --dry-run report it), and deletes stray staged
.*.k26-tmp files. One writing command at a time per site: apply and --revert
hold an exclusive lock on <site>/.k26-ddtree.lock (creating it). --check and
--dry-run create nothing: they hold it shared when the file exists, else read
unlocked and read again under the lock if a writer started meanwhile. A
command that finds the lock busy waits up to --lock-timeout seconds (at most
3600), saying for whom ("pid N (apply)", or "another process" when the holder
is not a writer that named itself), then gives up with exit 75.

apply also makes this k26_ddtree importable by sglang's Python (the patched
files import k26_ddtree.sglang): nothing if it already is; a
k26_ddtree_sglang.pth in the site dir pointing at this checkout when sglang is
in a real site-packages; else a marked copy of the package beside sglang (a
PYTHONPATH dir or bundle, where .pth files are not read).

--revert puts the originals back (from the backups, else by running the diffs
backwards), verifies their SHA256, then removes the backups and the .pth or
copy that apply added. A partially applied install (some files patched, some
pristine) is completed by apply and undone by --revert.
"""

EPILOG = """\
--check exit codes:
  0  applied: every file is the pinned patched file and sglang's Python can import k26_ddtree
  1  not applied, and `k26-deploy apply` would fix it: pristine, partially applied,
     or applied but k26_ddtree not importable
  1  also: an interrupted transaction was found (state: interrupted), or stray
     staged files are left; apply or --revert rolls it back / deletes them first
  2  apply would refuse: a file is foreign-modified, missing, a symlink or not a
     regular file, sglang is not the patch set's version or has none, or a
     different k26_ddtree is importable there (also for a bad --sglang-dir,
     pins.json or journal)

apply and --revert exit 0 on success (also when there was nothing to do), 2 when
they refuse (nothing changed), 1 when writing failed (rolled back: the message says
whether everything is as before). Every mode: 130 / 143 when stopped by SIGINT /
SIGTERM (after the rollback), 75 when the lock stayed busy past --lock-timeout.
"""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_TIMEOUT_S:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"not a number of seconds from 0 to {MAX_TIMEOUT_S:g}: {text!r}")
    return value


def register(sub) -> None:
    """Add this family's subcommands to the k26-deploy parser."""
    parser = sub.add_parser("apply", help=HELP, description=DESCRIPTION, epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sglang-dir", metavar="PATH", type=path_arg,
                        help="the sglang package dir or the dir holding it (default: the sglang this Python finds)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report pristine / applied / foreign-modified; change nothing")
    mode.add_argument("--revert", action="store_true", help="restore and verify the original files")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (apply or --revert) and change nothing")
    parser.add_argument("--patch-set", metavar="DIR",
                        help="a patch set directory (default: the shipped patches/sglang-VERSION of the installed "
                             "sglang; a version without one is refused, naming those there are)")
    parser.add_argument("--lock-timeout", metavar="SECONDS", type=_seconds, default=DEFAULT_TIMEOUT_S,
                        help="how long to wait while another command holds the site's lock "
                             f"(default {DEFAULT_TIMEOUT_S:g}, at most {MAX_TIMEOUT_S:g}; 0: refuse at once)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from k26_ddtree.errors import UserError
    from k26_ddtree.patchset import apply

    root = Path(args.patch_set) if args.patch_set else None
    if args.check:
        if args.dry_run:
            raise UserError("--check changes nothing already; drop --dry-run")
        return apply.check(args.sglang_dir, root, lock_timeout=args.lock_timeout)
    if args.revert:
        return apply.revert(args.sglang_dir, root, dry_run=args.dry_run, lock_timeout=args.lock_timeout)
    return apply.apply(args.sglang_dir, root, dry_run=args.dry_run, lock_timeout=args.lock_timeout)
