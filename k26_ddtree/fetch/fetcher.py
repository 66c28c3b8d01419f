"""Bring one hub repository into a model directory: plan, download with aria2c, verify, record.

Invariants:
- A file is in DIR only after its size and hash matched the hub's listing (LFS files by their
  SHA-256, small non-LFS files by their git blob id); aria2c writes into DIR/.partial and a
  verified file is renamed into place. A partial file never counts as done.
- SHA256SUMS exists only while every listed file is in place and verified; the stamp says
  `complete: true` at the same moment. While work is pending the stamp lists what is verified
  so far (an interrupted run keeps that work).
- A file that fails verification is deleted and downloaded once more; a second failure is
  reported and the run exits 1.
"""

from __future__ import annotations

import fcntl
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.errors import UserError
from k26_ddtree.fetch import modeldir
from k26_ddtree.fetch.aria2 import Aria2Job, Aria2Process, Aria2Settings, control_file
from k26_ddtree.hashing import Digests, file_digests
from k26_ddtree.fetch.hub import RepoFile, RepoSnapshot, resolve_url
from k26_ddtree.progress import Reporter, TotalMeter, as_they_finish, human_bytes

PARTIAL_NAME = ".partial"
_POLL_S = 0.5


@dataclass(frozen=True)
class Verdict:
    file: RepoFile
    digests: Digests | None  # None: the file was not there to hash
    ok: bool


def matches(file: RepoFile, digests: Digests) -> bool:
    if digests.size != file.size:
        return False
    if file.sha256:
        return digests.sha256 == file.sha256
    return digests.git_oid == file.git_oid


def describe_mismatch(file: RepoFile, digests: Digests | None) -> str:
    if digests is None:
        return "not downloaded"
    if digests.size != file.size:
        return f"{digests.size} bytes, expected {file.size}"
    if file.sha256:
        return f"sha256 {digests.sha256[:12]}…, expected {file.sha256[:12]}…"
    return f"git blob id {str(digests.git_oid)[:12]}…, expected {str(file.git_oid)[:12]}…"


def check_free_space(fetches: list["RepoFetch"]) -> None:
    """UserError when the planned downloads do not fit, before any of them creates anything.
    Destinations on one file system share its free space: the drafter must fit beside the model."""
    by_device: dict[int, tuple[Path, list[RepoFetch]]] = {}
    for fetch in fetches:
        # DEST may not exist yet: its nearest existing folder is on the file system it will be on.
        existing = next(p for p in (fetch.dest, *fetch.dest.parents) if p.exists())
        by_device.setdefault(existing.stat().st_dev, (existing, []))[1].append(fetch)
    for existing, group in by_device.values():
        needed = sum(fetch.bytes_to_download() for fetch in group)
        free = shutil.disk_usage(existing).free
        if needed > free:
            where = " and ".join(str(fetch.dest) for fetch in group)
            raise UserError(f"{where} {'has' if len(group) == 1 else 'have'} {human_bytes(free)} free but "
                            f"the download needs {human_bytes(needed)} more: free space or choose another --dest")


class RepoFetch:
    """One repository into one directory. `run()` returns the paths that failed (empty: done)."""

    def __init__(self, snapshot: RepoSnapshot, endpoint: str, dest: Path, token: str | None,
                 settings: Aria2Settings, reporter: Reporter, verify_workers: int = 2):
        self.snapshot = snapshot
        self.endpoint = endpoint
        self.dest = dest.resolve()
        self.partial = self.dest / PARTIAL_NAME
        self.token = token
        self.settings = settings
        self.reporter = reporter
        self.verify_workers = verify_workers
        self.verified: dict[str, dict] = {}
        self.present: list[RepoFile] = []  # in DEST, no stamp vouches for them: hashed first
        self.missing: list[RepoFile] = []  # not in DEST: downloaded

    # -- records ---------------------------------------------------------------------------

    def _record(self, file: RepoFile, digests: Digests) -> None:
        self.verified[file.path] = {
            "path": file.path, "size": file.size, "sha256": digests.sha256,
            "git_oid": file.git_oid, "mtime_ns": (self.dest / file.path).stat().st_mtime_ns}

    def _write_stamp(self, complete: bool) -> None:
        files = [self.verified[f.path] for f in self.snapshot.files if f.path in self.verified]
        modeldir.write_stamp(self.dest, repo=self.snapshot.repo, revision=self.snapshot.revision,
                             commit=self.snapshot.commit, files=files, complete=complete)

    def _known_good(self) -> dict[str, dict]:
        """Stamp entries that still describe the file on disk and the file the hub lists."""
        stamp = modeldir.read_stamp(self.dest)
        if stamp is None:
            return {}
        if stamp.get("repo") not in (None, self.snapshot.repo):
            raise UserError(f"{self.dest} holds {stamp['repo']}, not {self.snapshot.repo}: "
                            "choose another --dest")
        listed = {f.path: f for f in self.snapshot.files}
        good = {}
        for entry in stamp["files"]:
            file = listed.get(entry["path"])
            if file is None or entry["size"] != file.size:
                continue
            if (file.sha256 and entry.get("sha256") != file.sha256) or (
                    not file.sha256 and entry.get("git_oid") != file.git_oid):
                continue
            try:
                st = (self.dest / file.path).stat()
            except OSError:
                continue
            if st.st_size == file.size and st.st_mtime_ns == entry.get("mtime_ns"):
                good[file.path] = entry
        return good

    # -- the plan --------------------------------------------------------------------------

    def plan(self) -> None:
        """Sort the listed files into verified before, present and missing. Reads only: called
        before anything is created (a refused run leaves no trace) and again under the lock."""
        self.verified = self._known_good()
        todo = [f for f in self.snapshot.files if f.path not in self.verified]
        self.present = [f for f in todo if (self.dest / f.path).is_file()]
        self.missing = [f for f in todo if not (self.dest / f.path).is_file()]

    def bytes_to_download(self) -> int:
        """What the missing files still need on disk, less what their partials already hold."""
        needed = 0
        for file in self.missing:
            try:
                have = self._target(file).stat().st_blocks * 512
            except OSError:
                have = 0
            needed += max(file.size - have, 0)
        return needed

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> list[str]:
        """Fill DEST; call check_free_space() on the plans first."""
        try:
            self.partial.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot write into {self.dest}: {err.strerror}") from None
        with open(self.partial / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UserError(f"another fetch-model is already filling {self.dest}") from None
            failed = self._run_locked()
            if not failed:
                shutil.rmtree(self.partial, ignore_errors=True)
            return failed

    def _run_locked(self) -> list[str]:
        snap = self.snapshot
        self.plan()  # the first plan was made without the lock; this one is authoritative
        present, missing = self.present, list(self.missing)
        self.reporter.line(
            f"{snap.repo} @ {snap.revision} (commit {snap.commit[:12]}) -> {self.dest}: "
            f"{len(snap.files)} files, {human_bytes(snap.total_bytes)}; {len(self.verified)} verified "
            f"before, {len(present)} to check, {len(missing)} to download "
            f"({human_bytes(sum(f.size for f in missing))})")
        stamp = modeldir.read_stamp(self.dest) or {}
        if (not present and not missing and stamp.get("complete") and stamp.get("commit") == snap.commit
                and (self.dest / modeldir.SUMS_NAME).is_file()):
            self.reporter.line(f"{snap.repo}: nothing to do, all files verified before")
            return []
        (self.dest / modeldir.SUMS_NAME).unlink(missing_ok=True)
        self._write_stamp(complete=False)
        with ThreadPoolExecutor(self.verify_workers, thread_name_prefix="k26-verify") as pool:
            missing += self._check_present(present, pool)
            failed = self._download(missing, pool)
        if failed:
            self._write_stamp(complete=False)
            return failed
        modeldir.write_sums(self.dest, [(self.verified[f.path]["sha256"], f.path) for f in snap.files])
        self._write_stamp(complete=True)
        self.reporter.line(f"{snap.repo}: all {len(snap.files)} files verified; "
                           f"hashes in {self.dest / modeldir.SUMS_NAME}")
        return []

    def _check_present(self, present: list[RepoFile], pool: ThreadPoolExecutor) -> list[RepoFile]:
        """Hash files already in DIR that no stamp vouches for; return those that differ."""
        if not present:
            return []
        meter = TotalMeter("checked", sum(f.size for f in present))
        futures = [pool.submit(self._hash, self.dest / f.path, f, meter) for f in present]
        differ = []
        for future in as_they_finish(futures, lambda: self.reporter.tick(meter)):
            verdict = future.result()
            if verdict.ok:
                self._record(verdict.file, verdict.digests)
                self._write_stamp(complete=False)
                self.reporter.line(f"  ok (present)  {verdict.file.path}")
            else:
                self.reporter.line(f"  differs       {verdict.file.path}: "
                                   f"{describe_mismatch(verdict.file, verdict.digests)}; downloading it")
                differ.append(verdict.file)
        self.reporter.finish(meter)
        return differ

    def _hash(self, path: Path, file: RepoFile, meter: TotalMeter | None) -> Verdict:
        try:
            digests = file_digests(path, with_git_oid=not file.sha256,
                                   on_bytes=meter.add if meter is not None else None)
        except FileNotFoundError:
            return Verdict(file, None, False)
        return Verdict(file, digests, matches(file, digests))

    def _target(self, file: RepoFile) -> Path:
        # Named by content: a partial of another version of the file (the branch moved between
        # runs) is never resumed into this one; aria2c would refuse the length or mix the bytes.
        content_id = (file.sha256 or file.git_oid)[:16]
        return self.partial / f"{file.path}.{content_id}"

    def _discard_partial(self, file: RepoFile) -> None:
        self._target(file).unlink(missing_ok=True)
        control_file(self._target(file)).unlink(missing_ok=True)

    def _download(self, files: list[RepoFile], pool: ThreadPoolExecutor) -> list[str]:
        if not files:
            return []
        todo = self._settle_partials(files)
        meter = TotalMeter("downloaded", sum(f.size for f in todo),
                           already_done=self._in_flight_bytes(todo, {}))
        done_bytes = 0
        failed: list[str] = []
        for attempt in (1, 2):
            if not todo:
                break
            self.reporter.line(f"  aria2c: {len(todo)} files, {human_bytes(sum(f.size for f in todo))}, "
                               f"{self.settings.connections} connections per file, "
                               f"{self.settings.parallel_files} files at once"
                               + (" (second attempt)" if attempt == 2 else ""))
            results = self._aria2_round(todo, pool, meter, done_bytes)
            todo = []
            for file, verdict in results:
                if verdict is not None and verdict.ok:
                    done_bytes += file.size
                    continue
                if verdict is None:
                    if attempt == 1:
                        self.reporter.line(f"  FAILED  {file.path}: download did not finish; "
                                           "resuming it once more")
                        todo.append(file)
                    else:
                        self.reporter.line(f"  FAILED  {file.path}: download did not finish "
                                           "(rerun the same command to resume)")
                        failed.append(file.path)
                    continue
                self._discard_partial(file)
                if attempt == 1:
                    self.reporter.line(f"  BAD     {file.path}: {describe_mismatch(file, verdict.digests)}; "
                                       "deleted, downloading it again")
                    todo.append(file)
                else:
                    self.reporter.line(f"  BAD     {file.path}: {describe_mismatch(file, verdict.digests)} "
                                       "again; giving up on it")
                    failed.append(file.path)
        self.reporter.finish(meter)
        return failed

    def _settle_partials(self, files: list[RepoFile]) -> list[RepoFile]:
        """A partial of full length without aria2c's resume record is a finished download that
        was never verified (the previous run stopped in between): verify it now, not again."""
        todo = []
        for file in files:
            target = self._target(file)
            try:
                size = target.stat().st_size
            except FileNotFoundError:
                todo.append(file)
                continue
            resumable = control_file(target).exists()
            if size > file.size or (size == file.size and not resumable):
                verdict = self._hash(target, file, None)
                if verdict.ok:
                    self._accept(verdict)
                    continue
                self._discard_partial(file)
            todo.append(file)
        return todo

    def _accept(self, verdict: Verdict) -> None:
        file = verdict.file
        final = self.dest / file.path
        final.parent.mkdir(parents=True, exist_ok=True)
        self._target(file).replace(final)
        self._record(file, verdict.digests)
        self._write_stamp(complete=False)
        self.reporter.line(f"  ok      {file.path}  {human_bytes(file.size)}  "
                           f"sha256 {verdict.digests.sha256[:16]}…")

    def _aria2_round(self, files: list[RepoFile], pool: ThreadPoolExecutor, meter: TotalMeter,
                     done_before: int) -> list[tuple[RepoFile, Verdict | None]]:
        by_target = {self._target(f): f for f in files}
        for target in by_target:
            target.parent.mkdir(parents=True, exist_ok=True)
        jobs = [Aria2Job(resolve_url(self.endpoint, self.snapshot.repo, self.snapshot.commit, f.path),
                         self._target(f)) for f in files]
        verifying: dict[Future, RepoFile] = {}
        results: dict[str, tuple[RepoFile, Verdict | None]] = {}
        finished_bytes = 0

        def take_events(proc: Aria2Process) -> None:
            for kind, path in proc.events():
                file = by_target.get(path)
                if file is None or file.path in results or file in verifying.values():
                    continue
                if kind == "complete":
                    verifying[pool.submit(self._hash, path, file, None)] = file
                else:
                    results[file.path] = (file, None)

        with Aria2Process(jobs, self.token, self.settings, self.partial) as proc:
            while True:
                exited = not proc.running()
                take_events(proc)
                for future in [f for f in verifying if f.done()]:
                    file = verifying.pop(future)
                    verdict = future.result()
                    if verdict.ok:
                        self._accept(verdict)
                        finished_bytes += file.size
                    results[file.path] = (file, verdict)
                meter.set_done(done_before + finished_bytes + self._in_flight_bytes(files, results))
                self.reporter.tick(meter)
                if exited and not verifying:
                    break
                time.sleep(_POLL_S)
            if proc.returncode() not in (0, None):
                tail = [line for line in proc.output_tail if line.strip()][-8:]
                for line in tail:
                    self.reporter.line(f"  aria2c: {line}")
        return [results.get(f.path) or self._after_exit(f) for f in files]

    def _after_exit(self, file: RepoFile) -> tuple[RepoFile, Verdict | None]:
        """aria2c exited without a hook line for `file`: a complete file has no resume record."""
        target = self._target(file)
        if not target.is_file() or control_file(target).exists():
            return file, None
        verdict = self._hash(target, file, None)
        if verdict.ok:
            self._accept(verdict)
        return file, verdict

    def _in_flight_bytes(self, files: list[RepoFile], results: dict) -> int:
        """Bytes on disk of unfinished downloads. Allocated blocks, not st_size: with several
        connections per file aria2c writes at scattered offsets and the length jumps ahead."""
        total = 0
        for file in files:
            if file.path in results:
                continue
            try:
                st = self._target(file).stat()
            except OSError:
                continue
            total += min(st.st_blocks * 512, st.st_size, file.size)
        return total
