"""The server trace's writer (k26_ddtree/sglang/common/trace.py): header once, whole records only, the cap,
the flush, a failed write, one process per file. The worker step that feeds it is tested in
test_ddtree_worker_step.py, the flags in test_ddtree_server_args.py."""

from __future__ import annotations

import errno
import logging
import os
import struct
import time

import pytest
import torch

from k26_ddtree.sglang.common import trace

DEPTH = 3
META = {"depth": DEPTH, "topk": trace.TOPK, "model": "m", "drafter": "d", "started": "now"}


def step_records(batch, step=0, seed=0):
    """One decode step's records for `batch` requests, as the verify packs them."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 1000, (batch, DEPTH, trace.TOPK), generator=gen)
    logprobs = -torch.rand(batch, DEPTH, trace.TOPK, generator=gen).sort(dim=-1).values
    return trace.pack_records(list(range(batch)), [step] * batch, [7] * batch, tokens, logprobs,
                              [[1, 2]] * batch)


def header_size():
    return len(trace.header_bytes(META))


def cap_warnings(caplog):
    return [r for r in caplog.records if "reached its cap" in r.getMessage()]


def test_a_second_server_appends_after_the_first_without_a_second_header(tmp_path):
    path = tmp_path / "t.trace"
    first = trace.TraceWriter.open(path, META, 1 << 20)
    first.write(step_records(2, step=0))
    first.close()
    second = trace.TraceWriter.open(path, dict(META, started="later"), 1 << 20)
    second.write(step_records(1, step=1))
    second.close()

    meta, steps = trace.read(path)
    assert meta["started"] == "now"
    assert path.read_bytes().count(trace.MAGIC) == 1
    assert steps.step.tolist() == [0, 0, 1]


def test_the_cap_stops_tracing_before_a_step_would_pass_it_and_says_so_once(tmp_path, caplog):
    record = trace.record_size(DEPTH)
    path = tmp_path / "t.trace"
    writer = trace.TraceWriter.open(path, META, header_size() + 3 * record + record // 2)
    writer.write(step_records(2, step=0))
    with caplog.at_level(logging.WARNING, logger=trace.__name__):
        writer.write(step_records(2, step=1))  # 4 records: past the cap, so none of them
        writer.write(step_records(1, step=2))
    assert not writer.active
    writer.close()

    (warning,) = cap_warnings(caplog)
    assert str(path) in warning.getMessage() and "tracing stopped" in warning.getMessage()
    _, steps = trace.read(path)
    assert steps.step.tolist() == [0, 0]
    assert path.stat().st_size == header_size() + 2 * record


def test_records_reach_the_file_within_the_flush_interval(tmp_path):
    path = tmp_path / "t.trace"
    writer = trace.TraceWriter.open(path, META, 1 << 20, flush_seconds=0.05)
    writer.write(step_records(1))
    deadline = time.monotonic() + 10
    while path.stat().st_size == header_size() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.stat().st_size == header_size() + trace.record_size(DEPTH), "flushed before close"
    writer.close()


def test_a_failed_write_stops_tracing_and_leaves_whole_records(tmp_path, monkeypatch, caplog):
    path = tmp_path / "t.trace"
    writer = trace.TraceWriter.open(path, META, 1 << 20, flush_seconds=0.05)
    writer.write(step_records(1, step=0))
    deadline = time.monotonic() + 10
    while path.stat().st_size == header_size() and time.monotonic() < deadline:
        time.sleep(0.01)
    real_write = os.write
    calls = []

    def disk_fills(fd, data):
        if fd != writer._fd:
            return real_write(fd, data)
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(trace.os, "write", disk_fills)
    with caplog.at_level(logging.WARNING, logger=trace.__name__):
        writer.write(step_records(2, step=1))
        writer.close()
    monkeypatch.undo()

    (warning,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert "No space left on device" in warning.getMessage()
    assert not writer.active
    _, steps = trace.read(path)
    assert steps.step.tolist() == [0], "the half-written step was cut off"


def test_one_process_appends_at_a_time(tmp_path, caplog):
    path = tmp_path / "t.trace"
    holder = trace.TraceWriter.open(path, META, 1 << 20)
    with caplog.at_level(logging.WARNING, logger=trace.__name__):
        assert trace.TraceWriter.open(path, META, 1 << 20) is None
    assert "held by another process" in caplog.text
    holder.close()
    again = trace.TraceWriter.open(path, META, 1 << 20)
    assert again is not None
    again.close()


def test_open_refuses_a_trace_of_another_depth(tmp_path):
    path = tmp_path / "t.trace"
    trace.TraceWriter.open(path, META, 1 << 20).close()
    with pytest.raises(trace.TraceError, match="draft depth 3, this server drafts 7"):
        trace.TraceWriter.open(path, dict(META, depth=7), 1 << 20)


def test_step_draft_records_the_first_8_of_a_wider_top_k(tmp_path):
    path = tmp_path / "t.trace"
    writer = trace.TraceWriter.open(path, META, 1 << 20)
    logprobs = -torch.arange(2 * DEPTH * 12, dtype=torch.float32).view(2, DEPTH, 12) / 10
    tokens = torch.arange(2 * DEPTH * 12).view(2, DEPTH, 12)
    draft = trace.StepDraft.of(writer, torch.tensor([5, 6]), tokens, logprobs)
    draft.record(["a", "b"], [3, 4], [[1], [2, 3, 4, 5]])
    writer.close()

    _, steps = trace.read(path)
    assert steps.request.tolist() == [trace.request_key("a"), trace.request_key("b")]
    assert (steps.step.tolist(), steps.root.tolist()) == ([3, 4], [5, 6])
    assert torch.equal(steps.tokens, tokens[..., :8])
    assert torch.equal(steps.logprobs, logprobs[..., :8])
    assert steps.committed.tolist() == [[1, -1, -1, -1], [2, 3, 4, 5]]


def struct_record(request, step, root, tokens, logprobs, committed):
    """One record straight from the format in trace.py's docstring."""
    width = DEPTH + 1
    padded = committed[:width] + [-1] * (width - len(committed[:width]))
    span = DEPTH * trace.TOPK
    return struct.pack(f"<QIi{span}i{span}f{width}i", request, step, root, *tokens.reshape(-1).tolist(),
                       *logprobs.reshape(-1).tolist(), *padded)


def test_pack_records_writes_the_documented_layout():
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 163_840, (3, DEPTH, trace.TOPK), generator=gen)
    logprobs = -torch.rand(3, DEPTH, trace.TOPK, generator=gen)
    request = [(1 << 64) - 5, 12, 1 << 63]
    step, root = [0, 1, (1 << 32) - 1], [5, -1, 7]
    committed = [[], [1, 2, 3, 4, 5, 6], [9]]
    want = b"".join(struct_record(*args) for args in zip(request, step, root, tokens, logprobs, committed))
    assert trace.pack_records(request, step, root, tokens, logprobs, committed) == want
