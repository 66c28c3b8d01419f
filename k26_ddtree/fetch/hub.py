"""What a Hugging Face hub repository holds at one revision: paths, sizes, hashes, download URLs.

One request, the one huggingface_hub's `model_info(files_metadata=True)` makes:
`GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true` answers
`{"id": ..., "sha": "<commit>", "siblings": [{"rfilename": ..., "size": N, "blobId": "<git sha1>",
"lfs": {"sha256": ..., "size": N, "pointerSize": ...}}, ...]}`; `lfs` is present only for LFS
files. It also names the commit the revision points at, so every download URL is pinned to that
commit (`{endpoint}/{repo}/resolve/{commit}/{path}`) and a branch moving mid-download cannot mix
two versions of the model.
"""

from __future__ import annotations

import os
import re
import reprlib
from dataclasses import dataclass
from urllib.parse import quote

from k26_ddtree import jsonread
from k26_ddtree.errors import UserError

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_MODEL_REPO = "moonshotai/Kimi-K2.6"
# The K2.6 DFlash drafter the field deployments served (block 8, the shipped profiles' settings).
DEFAULT_DRAFTER_REPO = "SubSir/Kimi-K2.6-DFlash-tmp-long"

# Names this toolkit writes into a model directory; a repository file with one of them would collide.
RESERVED_NAMES = ("SHA256SUMS", ".k26-model.json", ".partial")

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# What git-check-ref-format(1) forbids anywhere in a ref name (the per-component rules are in
# check_revision).
_BAD_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{")

# An entry quoted in an error: bounded in depth and length, whatever the hub sent.
_PREVIEW = reprlib.Repr()
_PREVIEW.maxlevel, _PREVIEW.maxstring, _PREVIEW.maxother = 2, 60, 60


@dataclass(frozen=True)
class RepoFile:
    """One file of the repository. `sha256` is the LFS oid; small non-LFS files have only
    their git blob id (`git_oid`, SHA-1 of "blob <size>\\0" + content)."""

    path: str
    size: int
    sha256: str | None
    git_oid: str | None


@dataclass(frozen=True)
class RepoSnapshot:
    repo: str
    revision: str
    commit: str
    files: tuple[RepoFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def default_endpoint() -> str:
    """The hub to talk to: $HF_ENDPOINT (a mirror) or huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or DEFAULT_ENDPOINT


def check_repo_id(repo: str) -> str:
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise UserError(f"repository id {repo!r} is not of the form owner/name")
    return repo


def check_revision(revision: str, option: str) -> str:
    """A revision is a git ref name (branch, tag, `refs/pr/1`) or a commit SHA: refuse what
    `git check-ref-format` refuses, so `../x` or a control character never reaches a URL."""
    parts = revision.split("/")
    if (not revision or revision == "@" or _BAD_REF.search(revision) or revision.endswith(".")
            or any(not part or part.startswith(".") or part.endswith(".lock") for part in parts)):
        raise UserError(f"{option} {revision!r} is not a branch, tag or commit: a git ref name has no '..', "
                        "no part that starts with '.' or ends in '.lock', no spaces, control characters "
                        "or any of ~^:?*[\\")
    return revision


def resolve_url(endpoint: str, repo: str, commit: str, path: str) -> str:
    return f"{endpoint.rstrip('/')}/{repo}/resolve/{commit}/{quote(path)}"


def fetch_snapshot(endpoint: str, repo: str, revision: str, token: str | None,
                   timeout_s: float = 60.0) -> RepoSnapshot:
    """List `repo` at `revision` with sizes and hashes. UserError for what the user can fix
    (unknown repo or revision, gated repo without access, unreachable endpoint)."""
    import requests

    check_repo_id(repo)
    url = f"{endpoint.rstrip('/')}/api/models/{repo}/revision/{quote(revision, safe='')}"
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = requests.get(url, params={"blobs": "true"}, headers=headers, timeout=timeout_s)
    except requests.RequestException as err:
        raise UserError(f"cannot reach the hub at {endpoint}: {type(err).__name__}", code=1) from None
    if response.status_code in (401, 403):
        hint = ("the token was refused or lacks access (gated repository: accept its terms on the hub)"
                if token else "it does not exist, or it is gated or private and needs a token: "
                              "set HF_TOKEN or use --token-file")
        raise UserError(f"the hub refused to list {repo} (HTTP {response.status_code}): {hint}")
    if response.status_code == 404:
        raise UserError(f"{repo} at revision {revision!r} was not found on {endpoint}")
    if response.status_code != 200:
        raise UserError(f"listing {repo} at {endpoint} failed: HTTP {response.status_code}", code=1)
    try:
        info = jsonread.parse_json(response.content, f"the answer of {url}")
    except jsonread.TooDeep:
        raise UserError(f"{url} answered JSON nested too deeply to be a repository listing", code=1) from None
    except jsonread.Unreadable:
        raise UserError(f"{url} answered something that is not JSON: is {endpoint} a Hugging Face hub?",
                        code=1) from None
    try:
        return parse_snapshot(repo, revision, info)
    except ValueError as err:
        raise UserError(f"{url} answered no repository listing for {repo}: {err}", code=1) from None


def parse_snapshot(repo: str, revision: str, info: object) -> RepoSnapshot:
    """The snapshot in `info` (the decoded JSON answer); ValueError naming what is wrong with it.
    The answer comes from the network: nothing about its shape is taken for granted."""
    if not isinstance(info, dict):
        raise ValueError(f"the answer is a JSON {_json_kind(info)}, not an object")
    commit = info.get("sha")
    if not isinstance(commit, str) or not _HEX40.fullmatch(commit):
        raise ValueError("no commit sha")
    siblings = info.get("siblings", [])
    if not isinstance(siblings, list):
        raise ValueError(f"siblings is a JSON {_json_kind(siblings)}, not a list of files")
    files = [_parse_sibling(sibling) for sibling in siblings]
    if not files:
        raise ValueError("no files (the listing needs ?blobs=true)")
    files.sort(key=lambda f: f.path)
    for before, after in zip(files, files[1:]):
        if before.path == after.path:
            raise ValueError(f"{before.path!r} is listed twice")
    return RepoSnapshot(repo=repo, revision=revision, commit=commit, files=tuple(files))


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "list", str: "string", bool: "boolean"}.get(type(value), "number")


def _parse_sibling(sibling: object) -> RepoFile:
    if not isinstance(sibling, dict):
        raise ValueError(f"a file entry is a JSON {_json_kind(sibling)}, not an object: {_PREVIEW.repr(sibling)}")
    path = sibling.get("rfilename")
    size = sibling.get("size")
    # bool is an int to Python, not a size to anyone; no file system holds a file of 2**63 bytes.
    if not isinstance(path, str) or type(size) is not int or not 0 <= size < 1 << 63:
        raise ValueError(f"a file entry lacks rfilename/size: {_PREVIEW.repr(sibling)}")
    check_repo_path(path)
    lfs = sibling.get("lfs")
    sha256 = git_oid = None
    if lfs is not None:
        if not isinstance(lfs, dict):
            raise ValueError(f"{path}: lfs is a JSON {_json_kind(lfs)}, not an object")
        sha256 = _lower_hex(lfs.get("sha256"), _HEX64)
        if sha256 is None or lfs.get("size", size) != size:
            raise ValueError(f"{path}: LFS entry without a sha256 or with a different size")
    else:
        git_oid = _lower_hex(sibling.get("blobId"), _HEX40)
        if git_oid is None:
            raise ValueError(f"{path}: neither an LFS sha256 nor a git blob id")
    return RepoFile(path=path, size=size, sha256=sha256, git_oid=git_oid)


def _lower_hex(value: object, pattern: re.Pattern) -> str | None:
    return value.lower() if isinstance(value, str) and pattern.fullmatch(value.lower()) else None


def check_repo_path(path: str) -> None:
    """A listed path must stay inside the model directory and fit a sha256sum line."""
    parts = path.split("/")
    if (not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or any(c in path for c in "\\\n\r\0") or parts[0] in RESERVED_NAMES):
        raise ValueError(f"unsafe or reserved file path in the listing: {path!r}")
