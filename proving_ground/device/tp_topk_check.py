"""The draft top-K under tensor parallelism equals one rank's, with real collectives.

    python3 proving_ground/device/tp_topk_check.py [--tp 2] [--models DIR] [--device cuda|cpu]

`tp` processes (torch.distributed: NCCL on one GPU each, or gloo on the CPU)
each hold their vocab shard of the target lm_head, laid out as SGLang's
VocabParallelEmbedding lays it out (contiguous ranges; the trained proving-
ground target's `lm_head.weight` from DIR/target when --models is given, else
seeded random), and run draft.DraftHead.topk_logprobs over the same hidden
states: per-shard top-K and log-sum-exp, one all_gather each, the global merge.
Rank 0 compares with the whole-vocabulary top-K on one rank: tokens exactly,
log-probs within float32 rounding. The hidden states are float32, so the two
GEMMs differ only in summation order. Prints one line per case; exit code 1 if
any failed. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from k26_ddtree.sglang.common.draft import DraftHead  # noqa: E402

CASES = ((1, 4), (7, 8), (16 * 7, 4), (64 * 7, 8), (300, 16))  # (rows, topk): batch x draft depth


class Group:
    """The two GroupCoordinator members DraftHead uses, over torch.distributed."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        dist.all_gather_into_tensor(out, inp)


def lm_head(models: Path | None, vocab: int, hidden: int) -> torch.Tensor:
    if models is not None:
        from safetensors.torch import load_file

        return load_file(str(models / "target" / "model.safetensors"))["lm_head.weight"].float()
    return torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(0)) / hidden**0.5


def shard(weight: torch.Tensor, rank: int, tp: int) -> DraftHead:
    vocab = weight.shape[0]
    per = -(-vocab // tp)
    start, end = rank * per, min(vocab, (rank + 1) * per)
    rows = torch.zeros(per, weight.shape[1], dtype=weight.dtype)
    rows[: end - start] = weight[start:end]
    return DraftHead(weight=rows, num_org=end - start, org_start=start, num_org_padded=per, num_added=0,
                     added_start=vocab, tp_group=Group(tp))


def worker(rank: int, tp: int, port: int, device: str, models: str | None, results) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=tp, init_method=f"tcp://127.0.0.1:{port}")
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    weight = lm_head(Path(models) if models else None, 2048, 256)
    mine = shard(weight, rank, tp)
    mine = DraftHead(**{**mine.__dict__, "weight": mine.weight.to(dev)})
    whole = DraftHead(weight=weight.to(dev), num_org=weight.shape[0], org_start=0, num_org_padded=weight.shape[0],
                      num_added=0, added_start=weight.shape[0])
    failures = []
    for rows, topk in CASES:
        hidden = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows * 31 + topk)).to(dev)
        tokens, logprobs = mine.topk_logprobs(hidden, topk)
        if rank == 0:
            want_tokens, want_logprobs = whole.topk_logprobs(hidden, topk)
            if not torch.equal(tokens, want_tokens):
                failures.append(f"rows={rows} topk={topk}: tokens differ in {int((tokens != want_tokens).sum())} places")
            elif not torch.allclose(logprobs, want_logprobs, rtol=0, atol=1e-5):
                failures.append(f"rows={rows} topk={topk}: log-probs differ by "
                                f"{float((logprobs - want_logprobs).abs().max()):.2e}")
    if rank == 0:
        results.put(failures)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--models", help="the proving-ground models folder: use its target's lm_head")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        print(f"tp_topk_check: needs {args.tp} GPUs, found {torch.cuda.device_count()}")
        return 2
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(worker, args=(args.tp, free_port(), args.device, args.models, results), nprocs=args.tp,
                       start_method="spawn", join=True)
    failures = results.get(timeout=60)
    for line in failures:
        print(f"FAIL {line}")
    print(f"tp_topk_check: TP{args.tp} on {args.device}: {len(CASES) - len(failures)}/{len(CASES)} cases equal TP1")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
