"""Subcommands of the fetch family: fetch-model, verify-model."""

from __future__ import annotations

import argparse
import re

from k26_ddtree.cli.checks import http_url, path_arg
from k26_ddtree.errors import UserError

# Files at once, each with up to 16 connections: aria2c holds a socket per connection and a
# descriptor per file, and 32 x 16 = 512 sockets is already half the usual open-file limit of 1024.
MAX_PARALLEL_FILES = 32

_FETCH_EPILOG = """\
The token comes from $HF_TOKEN or $HUGGING_FACE_HUB_TOKEN, else from --token-file (default
$HF_TOKEN_PATH, $HF_HOME/token or ~/.cache/huggingface/token), which must be mode 0600. It is
never accepted on the command line, never printed, and reaches aria2c only through a pipe.

Files land in DEST/.partial first and move into DEST once their size and hash match the hub's
listing (SHA-256 for LFS files, the git blob id for small files); then DEST/SHA256SUMS and
DEST/.k26-model.json record them. Rerun the same command to resume an interrupted download;
verified files are skipped. Exit 1 when a file cannot be downloaded or fails verification twice.
"""


def register(sub) -> None:
    """Add this family's subcommands to the k26-deploy parser."""
    from k26_ddtree.fetch.hub import DEFAULT_DRAFTER_REPO, DEFAULT_MODEL_REPO

    fetch = sub.add_parser(
        "fetch-model", help="download the model (and drafter) with aria2c, verified by SHA-256",
        description="Download Kimi K2.6 and its DFlash drafter (two hub repositories) with aria2c:\n"
                    "many connections per file, several files at once, resumable, every file\n"
                    "verified before it counts. The drafter goes to DEST-DFlash unless\n"
                    "--drafter-dest says otherwise; --no-drafter fetches the model alone.",
        epilog=_FETCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    fetch.add_argument("--model", default=DEFAULT_MODEL_REPO, metavar="REPO",
                       help="hub repository of the target model (default: %(default)s)")
    fetch.add_argument("--dest", required=True, type=path_arg, metavar="DIR",
                       help="model directory to fill (created if missing)")
    fetch.add_argument("--revision", default="main", metavar="REV",
                       help="branch, tag or commit of --model (default: %(default)s)")
    # The drafter options default to None, not their values: given with --no-drafter they are refused.
    fetch.add_argument("--drafter", metavar="REPO",
                       help=f"hub repository of the DFlash drafter (default: {DEFAULT_DRAFTER_REPO})")
    fetch.add_argument("--no-drafter", action="store_true",
                       help="fetch --model alone, without a drafter")
    fetch.add_argument("--drafter-dest", type=path_arg, metavar="DIR",
                       help="directory for the drafter (default: DEST-DFlash beside --dest; the shipped "
                            "profiles pair /models/Kimi-K2.6 with /models/Kimi-K2.6-DFlash)")
    fetch.add_argument("--drafter-revision", metavar="REV",
                       help="branch, tag or commit of --drafter (default: main)")
    fetch.add_argument("--connections", type=int, default=16, metavar="N",
                       help="connections per file, 1-16 (aria2c -x/-s; default: %(default)s)")
    fetch.add_argument("--parallel-files", type=int, default=6, metavar="N",
                       help=f"files downloaded at once, 1-{MAX_PARALLEL_FILES} (aria2c -j; default: %(default)s)")
    fetch.add_argument("--min-split-size", default="20M", metavar="SIZE",
                       help="smallest piece a file is split into for several connections "
                            "(aria2c -k, 1M-1024M; default: %(default)s)")
    fetch.add_argument("--endpoint", metavar="URL",
                       help="hub endpoint (default: $HF_ENDPOINT or https://huggingface.co)")
    fetch.add_argument("--token-file", type=path_arg, metavar="FILE",
                       help="file holding the hub token, mode 0600 (see below)")
    fetch.set_defaults(func=fetch_model)

    verify = sub.add_parser(
        "verify-model", help="check a model directory against its SHA256SUMS (offline)",
        description="Hash every file listed in DIR/SHA256SUMS and compare (offline; also for a "
                    "directory copied from elsewhere). Exit 1 naming the files that are missing "
                    "or differ. On success the directory's stamp is recorded, so render, install and "
                    "reconfigure accept it; a read-only directory is verified all the same (exit 0) "
                    "and the output says that its stamp could not be recorded.")
    verify.add_argument("dir", type=path_arg, metavar="DIR", help="the model directory")
    verify.set_defaults(func=verify_model)


def _check_split_size(text: str) -> None:
    match = re.fullmatch(r"([0-9]+)([KM]?)", text)
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20}
    if not match or not (1 << 20) <= int(match.group(1)) * scale[match.group(2)] <= (1 << 30):
        raise UserError("--min-split-size takes a size from 1M to 1024M, like 20M (aria2c -k)")


def fetch_model(args) -> int:
    from k26_ddtree.fetch.aria2 import Aria2Settings, find_aria2c
    from k26_ddtree.fetch.fetcher import RepoFetch, check_free_space
    from k26_ddtree.fetch.hub import (DEFAULT_DRAFTER_REPO, check_repo_id, check_revision, default_endpoint,
                                      fetch_snapshot)
    from k26_ddtree.progress import Reporter
    from k26_ddtree.fetch.token import load_token

    if not 1 <= args.connections <= 16:
        raise UserError("--connections must be between 1 and 16 (aria2c's limit per server)")
    if not 1 <= args.parallel_files <= MAX_PARALLEL_FILES:
        raise UserError(f"--parallel-files must be between 1 and {MAX_PARALLEL_FILES}")
    _check_split_size(args.min_split_size)
    targets = [(check_repo_id(args.model), check_revision(args.revision, "--revision"), args.dest)]
    if args.no_drafter:
        for option, value in (("--drafter", args.drafter), ("--drafter-dest", args.drafter_dest),
                              ("--drafter-revision", args.drafter_revision)):
            if value is not None:
                raise UserError(f"{option} and --no-drafter contradict each other: drop one")
    else:
        model_dest = args.dest.resolve()
        drafter_dest = args.drafter_dest or model_dest.parent / f"{model_dest.name}-DFlash"
        if drafter_dest.resolve() == args.dest.resolve():
            raise UserError(f"the drafter would land in {args.dest} with the model: pass --drafter-dest")
        targets.append((check_repo_id(args.drafter or DEFAULT_DRAFTER_REPO),
                        check_revision(args.drafter_revision or "main", "--drafter-revision"), drafter_dest))
    for _repo, _revision, dest in targets:
        if dest.exists() and not dest.is_dir():
            raise UserError(f"{dest} exists and is not a directory (--dest and --drafter-dest name directories)")
    endpoint = http_url(args.endpoint or default_endpoint(), "hub endpoint", "https://huggingface.co").rstrip("/")
    find_aria2c()
    token = load_token(args.token_file)
    settings = Aria2Settings(connections=args.connections, parallel_files=args.parallel_files,
                             min_split_size=args.min_split_size)
    reporter = Reporter()
    # Both listings first: a mistyped drafter repo fails in seconds, not after the model.
    fetches = [RepoFetch(fetch_snapshot(endpoint, repo, revision, token), endpoint, dest, token, settings,
                         reporter) for repo, revision, dest in targets]
    # Every refusal before the first byte is written: a run that cannot finish creates nothing.
    for fetch in fetches:
        fetch.plan()
    check_free_space(fetches)
    failed: list[str] = []
    for fetch in fetches:
        failed += [f"{fetch.snapshot.repo}:{path}" for path in fetch.run()]
    if failed:
        raise UserError(f"{len(failed)} files not fetched and verified: {', '.join(failed)}", code=1)
    for _repo, _revision, dest in targets:
        reporter.line(f"ready: {dest.resolve()}")
    return 0


def verify_model(args) -> int:
    from k26_ddtree.fetch.modeldir import verify_model as verify
    from k26_ddtree.progress import Reporter

    verify(args.dir.resolve(), Reporter())
    return 0
