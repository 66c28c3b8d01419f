"""A model directory's records: `SHA256SUMS` (sha256sum format, paths relative to the directory)
and the stamp `.k26-model.json` (repo, revision, commit, files with sizes, when verified).

`SHA256SUMS` is what travels with the model and what `sha256sum -c SHA256SUMS` and
`k26-deploy verify-model` check. The stamp says the directory is complete and verified, and
keeps each file's size and mtime so a rerun of fetch-model can skip files it already hashed.
Both are written only through a temporary file and os.replace.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from k26_ddtree import atomic, hashing, jsonread
from k26_ddtree.errors import UserError
from k26_ddtree.fetch.hub import DEFAULT_DRAFTER_REPO, DEFAULT_MODEL_REPO
from k26_ddtree.progress import Reporter, TotalMeter, as_they_finish, human_bytes
from k26_ddtree.hashing import file_digests

SUMS_NAME = "SHA256SUMS"
STAMP_NAME = ".k26-model.json"
STAMP_FORMAT = 1


def write_sums(model_dir: Path, entries: list[tuple[str, str]]) -> None:
    """entries: (sha256, relative path); written sorted by path, as `sha256sum` writes them."""
    lines = [f"{sha}  {rel}\n" for sha, rel in sorted(entries, key=lambda e: e[1])]
    atomic.write_text(model_dir / SUMS_NAME, "".join(lines))


def read_sums(model_dir: Path) -> list[tuple[str, str]]:
    """(sha256, relative path) of every file SHA256SUMS lists, in its order."""
    path = model_dir / SUMS_NAME
    # The hashes must be the folder's own: a link to a list elsewhere could vouch for anything.
    outside = hashing.link_leaving(model_dir, SUMS_NAME)
    if outside is not None:
        raise UserError(f"{path} is a link to {outside}, outside {model_dir}: copy the file in")
    try:
        entries = hashing.read_sums(path)
    except FileNotFoundError:
        raise UserError(f"{path} does not exist: this directory has no recorded hashes") from None
    if not entries:
        raise UserError(f"{path} lists no files")
    return [(sha, rel) for rel, sha in entries.items()]


def read_stamp(model_dir: Path) -> dict | None:
    """The stamp, or None when absent or unreadable (then nothing in it can be trusted)."""
    try:
        stamp = jsonread.read_json(model_dir / STAMP_NAME)
    except (FileNotFoundError, jsonread.Unreadable):
        return None
    if not isinstance(stamp, dict) or stamp.get("format") != STAMP_FORMAT:
        return None
    files = stamp.get("files")
    if not isinstance(files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("size"), int)
            for f in files):
        return None
    return stamp


def write_stamp(model_dir: Path, *, repo: str | None, revision: str | None, commit: str | None,
                files: list[dict], complete: bool) -> None:
    """files: dicts with path, size, sha256, git_oid (or None), mtime_ns."""
    atomic.write_text(model_dir / STAMP_NAME, stamp_text(repo=repo, revision=revision, commit=commit,
                                                         files=files, complete=complete))


def stamp_text(*, repo: str | None, revision: str | None, commit: str | None, files: list[dict],
               complete: bool) -> str:
    stamp = {
        "format": STAMP_FORMAT,
        "repo": repo,
        "revision": revision,
        "commit": commit,
        "complete": complete,
        "verified_at": utc_now() if complete else None,
        "total_bytes": sum(f["size"] for f in files),
        "files": sorted(files, key=lambda f: f["path"]),
    }
    return json.dumps(stamp, indent=1) + "\n"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def model_dir_problem(path: str | os.PathLike, repo: str | None = None) -> str | None:
    """None when `path` is a complete, verified model directory; else one line naming the
    problem and the command that fixes it. Quick: checks presence and sizes, never hashes.
    `repo` names the hub repository in that command when the directory's stamp cannot."""
    model_dir = Path(path)
    stamp = read_stamp(model_dir) if model_dir.is_dir() else None
    fix_repo = repo or (stamp or {}).get("repo") or _guess_repo(model_dir)
    fix = f"run `k26-deploy fetch-model --model {fix_repo} --dest {model_dir} --no-drafter`"
    if not model_dir.is_dir():
        return f"model directory {model_dir} is missing: {fix}"
    if not (model_dir / SUMS_NAME).is_file():
        return (f"model directory {model_dir} has no {SUMS_NAME} (never fetched, or the fetch "
                f"did not finish): {fix}")
    if stamp is None or not stamp.get("complete"):
        return (f"model directory {model_dir} is not verified (no complete {STAMP_NAME}): {fix}, "
                f"or `k26-deploy verify-model {model_dir}` if it was copied here by other means")
    try:
        listed = read_sums(model_dir)
    except UserError as err:
        return f"{err}: {fix}"
    sizes = {f["path"]: f["size"] for f in stamp["files"]}
    for _sha, rel in listed:
        if rel not in sizes:
            return (f"model directory {model_dir}: {SUMS_NAME} lists {rel} but {STAMP_NAME} does not: "
                    f"run `k26-deploy verify-model {model_dir}`")
        try:
            size = (model_dir / rel).stat().st_size
        except OSError:
            return f"model directory {model_dir} lacks {rel}: {fix}"
        if size != sizes[rel]:
            return (f"model directory {model_dir}: {rel} has {size} bytes, expected {sizes[rel]}: {fix}")
    return None


def _guess_repo(model_dir: Path) -> str:
    # Without a stamp the repository is unknown; a drafter folder must not be told to fetch K2.6.
    name = model_dir.name.lower()
    return DEFAULT_DRAFTER_REPO if "dflash" in name or "draft" in name else DEFAULT_MODEL_REPO


def verify_model(model_dir: Path, reporter: Reporter, workers: int = 4) -> None:
    """Hash every file listed in SHA256SUMS (offline), `workers` files at a time (one core
    hashes ~1-2 GB/s, below what an NVMe array reads). Raises UserError(code=1) naming the
    files that are missing, differ, or are links that leave the directory. Verifying needs read
    access only. On success the stamp is (re)written, so a directory received by other means is
    accepted by apply/render afterwards; a directory that cannot be written is reported, not failed."""
    if not model_dir.is_dir():
        problem = "is not a directory" if model_dir.exists() else "does not exist"
        raise UserError(f"model directory {model_dir} {problem}")
    entries = read_sums(model_dir)
    expected = dict((rel, sha) for sha, rel in entries)
    present, bad = [], []
    for _sha, rel in entries:
        outside = hashing.link_leaving(model_dir, rel)
        if outside is not None:
            bad.append(rel)
            reporter.line(f"  OUTSIDE  {rel}  (a link to {outside}, outside {model_dir}: copy the file in)")
        elif (model_dir / rel).is_file():
            present.append(rel)
        elif (model_dir / rel).exists():
            bad.append(rel)
            reporter.line(f"  NOT A FILE  {rel}  (a folder, FIFO or device where the file belongs)")
        else:
            bad.append(rel)
            reporter.line(f"  MISSING  {rel}")
    meter = TotalMeter("verified", sum((model_dir / rel).stat().st_size for rel in present))
    reporter.line(f"verify {model_dir}: {len(entries)} files, {human_bytes(meter.total)}")
    verified: list[dict] = []
    with ThreadPoolExecutor(workers, thread_name_prefix="k26-verify") as pool:
        futures = {pool.submit(file_digests, model_dir / rel, on_bytes=meter.add): rel
                   for rel in present}
        for future in as_they_finish(list(futures), lambda: reporter.tick(meter)):
            rel = futures[future]
            digests = future.result()
            if digests.sha256 != expected[rel]:
                reporter.line(f"  BAD      {rel}  (sha256 {digests.sha256[:12]}…, "
                              f"expected {expected[rel][:12]}…)")
                bad.append(rel)
                continue
            reporter.line(f"  ok       {rel}  {human_bytes(digests.size)}")
            verified.append({"path": rel, "size": digests.size, "sha256": digests.sha256,
                             "git_oid": None, "mtime_ns": (model_dir / rel).stat().st_mtime_ns})
    reporter.finish(meter)
    if bad:
        bad.sort()
        raise UserError(f"{len(bad)} of {len(entries)} files failed verification in {model_dir}: "
                        + ", ".join(bad), code=1)
    _refresh_stamp(model_dir, verified, reporter)


def _refresh_stamp(model_dir: Path, verified: list[dict], reporter: Reporter) -> None:
    """Record the verification in the stamp. A folder that cannot be written (a read-only mount)
    still verified: say what that means for render/install instead of failing."""
    stamp = read_stamp(model_dir) or {}
    old = {f["path"]: f for f in stamp.get("files", [])}
    files = [{**v, "git_oid": old.get(v["path"], {}).get("git_oid")} for v in verified]
    text = stamp_text(repo=stamp.get("repo"), revision=stamp.get("revision"), commit=stamp.get("commit"),
                      files=files, complete=True)
    try:
        atomic.replace(model_dir / STAMP_NAME, text.encode("utf-8"))
    except OSError as err:
        already = model_dir_problem(model_dir) is None
        reporter.line(f"verified, but not recorded: {model_dir / STAMP_NAME} cannot be written "
                      f"({err.strerror or err}); "
                      + ("its existing stamp already marks the folder verified" if already else
                         "render/install accept the folder only with a recorded stamp: run verify-model "
                         "on it where it is writable (before it is mounted read-only)"))
