"""The DDTree server trace: per decode step and request, the drafter's top-8 and what was committed.

`k26-deploy tune` replays it: under greedy decoding a step rooted anywhere
commits the longest path of its tree that matches the tokens actually committed
from there on, so one trace of production-like traffic gives the acceptance of
every tree shape without serving any of them.

File layout (version 1), little-endian, append-only:

    b"K26DDTREE-TRACE 1\n"
    one line of JSON: {"depth": D, "topk": 8, "model": ..., "drafter": ...,
                       "served": "1:budget/topk" or the schedule, "spine": ..., "block_size": ..., "started": ISO time}
    records of record_size(D) bytes each (_record_dtype, which writes and reads them):
        request   u64    hash of the request id (steps of one request share it)
        step      u32    the request's decode step, from 0
        root      i32    the step's root token (the last committed token)
        tokens    i32[D * TOPK]   the drafter's top-TOPK tokens at draft depths 1..D
        logprobs  f32[D * TOPK]   their log-probs, descending per depth
        committed i32[D + 1]      the tokens the step committed, -1 padded

Only greedy requests are recorded (top_k 1, which SGLang makes of temperature 0): a
sampled step's committed text is a draw, not the argmax continuation the replay matches.

The server writes it (`--speculative-ddtree-trace PATH`, capped by
`--speculative-ddtree-trace-max-mb`): the drafter keeps each step's top-TOPK on
the device (StepDraft, carried on the step's StepTree), the verify records it
with what each request committed, and TraceWriter appends the records from a
thread of its own, TP rank 0 only.

No sglang imports: the tune command reads traces on machines without it.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from k26_ddtree import jsonread
from k26_ddtree.paths import open_input

logger = logging.getLogger(__name__)

MAGIC = b"K26DDTREE-TRACE 1\n"
TOPK = 8
MB = 1 << 20
# Records reach the file within this many seconds of their step.
FLUSH_SECONDS = 2.0
# More than any header line; check_appendable reads no further.
_HEADER_PEEK = 1 << 16
# Draft depths a DFlash block can have (block size 2..64): a header naming another is no trace's.
MAX_DEPTH = 63
# tune reads at most this much: four times the server's default cap, and a few hundred MB of the
# columns tune keeps per step.
MAX_READ_BYTES = 4 << 30
# Records per chunk read: a few MB, whatever the trace's size.
CHUNK_RECORDS = 8192


def record_size(depth: int) -> int:
    return _record_dtype(depth).itemsize


# Cached: a running request is hashed once, not every decode step (4096 ids: more than a server runs at once).
@functools.lru_cache(maxsize=1 << 12)
def request_key(rid: str) -> int:
    """A stable 64-bit key of an SGLang request id."""
    return int.from_bytes(hashlib.blake2b(str(rid).encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Steps:
    """Trace records, batched: S steps of draft depth D.

    request [S] int64, step [S] int64, root [S] int64
    tokens [S, D, TOPK] int64, logprobs [S, D, TOPK] float32, committed [S, D + 1] int64 (-1 padded)
    """

    request: torch.Tensor
    step: torch.Tensor
    root: torch.Tensor
    tokens: torch.Tensor
    logprobs: torch.Tensor
    committed: torch.Tensor


def header_bytes(meta: dict) -> bytes:
    return MAGIC + (json.dumps(meta, sort_keys=True) + "\n").encode()


@functools.lru_cache(maxsize=None)
def _record_dtype(depth: int) -> np.dtype:
    """One record's layout, the module docstring's, for writing and reading alike."""
    span = depth * TOPK
    return np.dtype([("request", "<u8"), ("step", "<u4"), ("root", "<i4"), ("tokens", "<i4", (span,)),
                     ("logprobs", "<f4", (span,)), ("committed", "<i4", (depth + 1,))])


def pack_records(request: list[int], step: list[int], root: list[int], tokens: torch.Tensor,
                 logprobs: torch.Tensor, committed: list[list[int]]) -> bytes:
    """The records of one decode step's B requests; tokens / logprobs [B, D, TOPK] on the CPU.

    Filled column by column into one structured array rather than record by record: the server
    packs every step, and per record that cost ~4 µs (~240 µs a step at B = 64)."""
    batch, depth, _ = tokens.shape
    width = depth + 1
    rows = np.empty(batch, dtype=_record_dtype(depth))
    rows["request"] = request
    rows["step"] = step
    rows["root"] = root
    rows["tokens"] = tokens.flatten(1).to(torch.int32).numpy()
    rows["logprobs"] = logprobs.flatten(1).to(torch.float32).numpy()
    rows["committed"] = [c[:width] + [-1] * (width - len(c[:width])) for c in committed]
    return rows.tobytes()


class TraceError(ValueError):
    """A trace file that is not one, is empty, or ends in a partial record."""


def _header(data: bytes, path: Path) -> tuple[dict, int, int]:
    """(header, draft depth, offset of the first record) of a trace's first bytes."""
    if not data.startswith(MAGIC):
        raise TraceError(f"{path} is not a DDTree trace (it does not start with {MAGIC.strip().decode()!r})")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise TraceError(f"{path}: the trace header is damaged (no end of line in its first bytes)")
    try:
        meta = jsonread.parse_json(data[len(MAGIC):end], "the trace header")
        depth = meta["depth"]
    except (ValueError, KeyError, TypeError):
        raise TraceError(f"{path}: the trace header is damaged") from None
    if type(depth) is not int or not 1 <= depth <= MAX_DEPTH:
        raise TraceError(f"{path}: the trace header's depth {str(depth)[:20]} is not a draft depth 1..{MAX_DEPTH}")
    return meta, depth, end + 1


@dataclass(frozen=True)
class Records:
    """A trace file's header and where its records lie, read chunk by chunk (never whole)."""

    path: Path
    header: dict
    depth: int
    start: int
    count: int

    def chunks(self, rows: int = CHUNK_RECORDS):
        """The records in file order, `rows` at a time, as numpy structured arrays (_record_dtype)."""
        dtype = _record_dtype(self.depth)
        with open_input(self.path, f"trace {self.path}", MAX_READ_BYTES) as handle:
            handle.seek(self.start)
            for lo in range(0, self.count, rows):
                part = np.empty(min(rows, self.count - lo), dtype=dtype)
                if handle.readinto(memoryview(part).cast("B")) != part.nbytes:
                    raise TraceError(f"{self.path} shrank while it was read")
                yield part


def open_records(path: Path) -> Records:
    """The header and record count of a trace file; TraceError naming what is wrong."""
    path = Path(path)
    try:
        with open_input(path, f"trace {path}", MAX_READ_BYTES) as handle:
            head = handle.read(_HEADER_PEEK)
            size = os.fstat(handle.fileno()).st_size
    except FileNotFoundError:
        raise TraceError(f"cannot read trace {path}: no such file") from None
    meta, depth, start = _header(head, path)
    body, whole = size - start, record_size(depth)
    if body <= 0:
        raise TraceError(f"{path} holds no decode steps (the server traced nothing yet)")
    if body % whole:
        raise TraceError(f"{path} is not a whole number of {whole}-byte records of draft depth {depth}: "
                         f"{body % whole} bytes are left over after {body // whole} (a write cut short, or bytes "
                         "the trace writer did not write)")
    return Records(path, meta, depth, start, body // whole)


def steps_of(rows: np.ndarray, depth: int) -> Steps:
    """Records (a chunk) as tensors."""
    shape = (len(rows), depth, TOPK)

    def column(name: str, dtype) -> torch.Tensor:
        return torch.from_numpy(rows[name].astype(dtype))

    # A u64 key wraps to the int64 of the same bits, as one key of a request.
    return Steps(column("request", np.int64), column("step", np.int64), column("root", np.int64),
                 column("tokens", np.int64).view(shape), column("logprobs", np.float32).view(shape),
                 column("committed", np.int64))


def read(path: Path) -> tuple[dict, Steps]:
    """(header, every record) of a trace file; TraceError naming what is wrong."""
    records = open_records(path)
    return records.header, steps_of(np.concatenate(list(records.chunks())), records.depth)


def check_appendable(path: Path, depth: int) -> None:
    """Refuse (TraceError, one line) a path a server of draft depth `depth` cannot append to:
    a missing or read-only folder, a folder, a read-only file, or a non-empty file that is
    not a whole trace of that depth (appending would misalign every later record)."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise TraceError(f"the folder of {path} does not exist")
    if path.is_dir():
        raise TraceError(f"{path} is a folder, not a trace file")
    if not path.exists():
        if not os.access(folder, os.W_OK | os.X_OK):
            raise TraceError(f"cannot create {path}: {folder} is not writable")
        return
    if not os.access(path, os.W_OK):
        raise TraceError(f"{path} is not writable")
    with open(path, "rb") as f:
        head = f.read(_HEADER_PEEK)
        size = os.fstat(f.fileno()).st_size
    if not head:
        return
    try:
        _, found, start = _header(head, path)
    except TraceError as err:
        raise TraceError(f"{err}; refusing to append to it") from None
    if found != depth:
        raise TraceError(f"{path} is a trace of draft depth {found}, this server drafts {depth} positions; "
                         "refusing to append to it (give another path)")
    partial = (size - start) % record_size(depth)
    if partial:
        raise TraceError(f"{path} is truncated: {partial} bytes of a partial record at the end; "
                         "refusing to append to it")


def served_text(server_args) -> str:
    """What the server serves: its schedule, or its one budget/topk written as a schedule."""
    schedule = server_args.speculative_ddtree_budget_schedule
    if schedule is not None:
        return str(schedule)
    return f"1:{int(server_args.speculative_ddtree_budget)}/{int(server_args.speculative_ddtree_topk)}"


def server_meta(server_args) -> dict:
    """The header of a validated ServerArgs' trace (DDTree on, block size split off)."""
    block_size = int(server_args.speculative_dflash_block_size)
    return {
        "depth": block_size - 1,
        "topk": TOPK,
        "model": server_args.model_path,
        "drafter": server_args.speculative_draft_model_path,
        "served": served_text(server_args),
        "spine": bool(server_args.speculative_ddtree_spine),
        "block_size": block_size,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class TraceWriter:
    """Appends one server's trace records to its file, up to a cap, never making a step wait on the disk.

    write() only appends a step's records to a buffer; a flusher thread writes the buffer every
    flush_seconds (and at close) with one os.write of whole records on an O_APPEND descriptor.
    A crash so loses at most the last seconds, and a write that fails part-way is cut back to the
    last whole record, which a buffered file (flushing at its own boundaries) could not promise.
    Once a step's records would take the file past max_bytes, or a write fails, tracing stops with
    one warning: the server never fails over its trace. An exclusive flock keeps a second process
    (another data-parallel rank, another server) from interleaving its records into the file.
    """

    def __init__(self, fd: int, path: Path, max_bytes: int, flush_seconds: float):
        self.path = path
        self.max_bytes = max_bytes
        self._fd = fd
        self._written = os.fstat(fd).st_size
        self._accepted = self._written
        self._pending = bytearray()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._flusher = threading.Thread(target=self._run, args=(flush_seconds,), name="k26-ddtree-trace", daemon=True)
        self._flusher.start()
        atexit.register(self.close)

    @classmethod
    def open(cls, path: Path, meta: dict, max_bytes: int, flush_seconds: float = FLUSH_SECONDS) -> TraceWriter | None:
        """Append to path, writing the header first when the file is new or empty; None, with a
        warning, while another process holds it. TraceError when path is no trace of meta's depth."""
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            logger.warning("DDTree trace %s is held by another process; this one does not trace", path)
            return None
        try:
            # Checked again under the lock: the file may have changed since the flags were validated.
            check_appendable(path, int(meta["depth"]))
            if os.fstat(fd).st_size == 0:
                _write_all(fd, header_bytes(meta))
        except BaseException:
            os.close(fd)
            raise
        writer = cls(fd, path, max_bytes, flush_seconds)
        logger.info("DDTree trace: appending to %s (cap %s MB).", path, writer.max_mb)
        return writer

    @classmethod
    def for_server(cls, server_args) -> TraceWriter | None:
        return cls.open(server_args.speculative_ddtree_trace, server_meta(server_args),
                        int(server_args.speculative_ddtree_trace_max_mb) * MB)

    @property
    def max_mb(self) -> str:
        return f"{self.max_bytes / MB:g}"

    @property
    def active(self) -> bool:
        return not self._stopped.is_set()

    def write(self, records: bytes) -> None:
        """Queue one step's whole records, or stop tracing if they would pass the cap."""
        with self._lock:
            if self._stopped.is_set():
                return
            if self._accepted + len(records) > self.max_bytes:
                logger.warning("DDTree trace reached its cap of %s MB at %s; tracing stopped", self.max_mb, self.path)
                self._stopped.set()
                return
            self._pending += records
            self._accepted += len(records)

    def close(self) -> None:
        """Write what is queued and release the file (idempotent)."""
        self._stopped.set()
        self._flusher.join()

    def _run(self, flush_seconds: float) -> None:
        while not self._stopped.wait(flush_seconds):
            self._flush()
        self._flush()
        os.close(self._fd)

    def _flush(self) -> None:
        with self._lock:
            data, self._pending = self._pending, bytearray()
        if not data:
            return
        try:
            _write_all(self._fd, data)
        except OSError as err:
            self._fail(err)
            return
        self._written += len(data)

    def _fail(self, err: OSError) -> None:
        logger.warning("DDTree trace write to %s failed (%s); tracing stopped", self.path, err.strerror or err)
        with self._lock:
            self._stopped.set()
            self._pending.clear()
        try:
            os.ftruncate(self._fd, self._written)
        except OSError as cut:
            logger.warning("DDTree trace %s may end in a partial record: cutting it back failed (%s)",
                           self.path, cut.strerror or cut)


@dataclass(frozen=True)
class StepDraft:
    """A traced decode step's draft until the step commits, on the device.

    writer    where the step's records go
    columns   [B, 1 + 2 * D * TOPK] int32: the root, the drafter's top-TOPK tokens at depths 1..D,
              then their float32 log-probs' bits: one tensor, so recording copies to the host once
    """

    writer: TraceWriter
    columns: torch.Tensor

    @classmethod
    def of(cls, writer: TraceWriter, roots: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor) -> StepDraft:
        """roots [B]; tokens / logprobs [B, D, K >= TOPK], log-probs descending along K."""
        columns = torch.cat([
            roots.unsqueeze(1).to(torch.int32),
            tokens[..., :TOPK].flatten(1).to(torch.int32),
            logprobs[..., :TOPK].to(torch.float32).flatten(1).view(torch.int32),
        ], dim=1)
        return cls(writer, columns)

    def record(self, rids: list[str], steps: list[int], committed: list[list[int]],
               rows: list[int] | None = None) -> None:
        """The step's records: per request its id, its decode step and the tokens it committed;
        `rows` picks the batch rows they are of (default: every row, in order)."""
        if not self.writer.active:
            return
        host = self.columns.cpu() if rows is None else self.columns[rows].cpu()
        batch, span = host.shape[0], (host.shape[1] - 1) // 2
        shape = (batch, span // TOPK, TOPK)
        tokens = host[:, 1:1 + span].reshape(shape)
        logprobs = host[:, 1 + span:].reshape(shape).view(torch.float32)
        records = pack_records([request_key(rid) for rid in rids], steps, host[:, 0].tolist(), tokens, logprobs,
                               committed)
        self.writer.write(records)
