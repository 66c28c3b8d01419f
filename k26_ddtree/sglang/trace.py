"""The DDTree server trace: per decode step and request, the drafter's top-8 and what was committed.

`k26-deploy tune` replays it: under greedy decoding a step rooted anywhere
commits the longest path of its tree that matches the tokens actually committed
from there on, so one trace of production-like traffic gives the acceptance of
every tree shape without serving any of them.

File layout (version 1), little-endian, append-only:

    b"K26DDTREE-TRACE 1\n"
    one line of JSON: {"depth": D, "topk": 8, "model": ..., "drafter": ..., "budget": ...,
                       "topk_served": ..., "spine": ..., "block_size": ..., "started": ISO time}
    records of RECORD.size bytes each:
        request   u64    hash of the request id (steps of one request share it)
        step      u32    the request's decode step, from 0
        root      i32    the step's root token (the last committed token)
        tokens    i32[D * TOPK]   the drafter's top-TOPK tokens at draft depths 1..D
        logprobs  f32[D * TOPK]   their log-probs, descending per depth
        committed i32[D + 1]      the tokens the step committed, -1 padded

No sglang imports: the tune command reads traces on machines without it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

MAGIC = b"K26DDTREE-TRACE 1\n"
TOPK = 8
_HEAD = struct.Struct("<QIi")


def record_size(depth: int) -> int:
    return _HEAD.size + 4 * (2 * depth * TOPK + depth + 1)


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


def pack_records(request: list[int], step: list[int], root: list[int], tokens: torch.Tensor,
                 logprobs: torch.Tensor, committed: list[list[int]]) -> bytes:
    """The records of one decode step's B requests; tokens / logprobs [B, D, TOPK] on the CPU."""
    batch, depth, _ = tokens.shape
    width = depth + 1
    rows = []
    tok = tokens.to(torch.int32).reshape(batch, -1)
    lps = logprobs.to(torch.float32).reshape(batch, -1)
    for b in range(batch):
        padded = committed[b][:width] + [-1] * (width - len(committed[b][:width]))
        rows.append(_HEAD.pack(request[b], step[b], root[b]) + tok[b].numpy().tobytes() + lps[b].numpy().tobytes()
                    + struct.pack(f"<{width}i", *padded))
    return b"".join(rows)


class TraceError(ValueError):
    """A trace file that is not one, is empty, or ends in a partial record."""


def read(path: Path) -> tuple[dict, Steps]:
    """(header, every record) of a trace file; TraceError naming what is wrong."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise TraceError(f"cannot read trace {path}: {err.strerror or err}") from None
    if not data.startswith(MAGIC):
        raise TraceError(f"{path} is not a DDTree trace (it does not start with {MAGIC.strip().decode()!r})")
    end = data.find(b"\n", len(MAGIC))
    try:
        meta = json.loads(data[len(MAGIC):end])
        depth = int(meta["depth"])
    except (ValueError, KeyError, TypeError):
        raise TraceError(f"{path}: the trace header is damaged") from None
    body = memoryview(data)[end + 1:]
    size = record_size(depth)
    if not len(body):
        raise TraceError(f"{path} holds no decode steps (the server traced nothing yet)")
    if len(body) % size:
        raise TraceError(f"{path} is truncated: {len(body) % size} bytes of a partial record at the end "
                         f"(after {len(body) // size} whole ones)")
    count = len(body) // size
    raw = torch.frombuffer(bytearray(body), dtype=torch.int32).view(count, size // 4)
    head = raw[:, :4]
    request = (head[:, 0].to(torch.int64) & 0xFFFFFFFF) | (head[:, 1].to(torch.int64) << 32)
    span = depth * TOPK
    tokens = raw[:, 4:4 + span].to(torch.int64).view(count, depth, TOPK)
    logprobs = raw[:, 4 + span:4 + 2 * span].clone().view(torch.float32).view(count, depth, TOPK)
    committed = raw[:, 4 + 2 * span:].to(torch.int64)
    return meta, Steps(request, (head[:, 2].to(torch.int64) & 0xFFFFFFFF), head[:, 3].to(torch.int64),
                       tokens, logprobs, committed)
