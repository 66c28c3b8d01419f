"""Per-request token capacity in the patched SGLang with DDTree on: the req_to_token row
width (_init_pools) and the scheduler's decode-memory reserve must cover the draft block,
which a small budget's tree does not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from server_args_support import cli, parse


class StopAfterReqToTokenPool(Exception):
    """Raised by the fake model config once _init_pools reaches the KV pool."""


class ModelConfig:
    context_len = 4096

    @property
    def hf_config(self):
        raise StopAfterReqToTokenPool


def req_to_token_width(server_args) -> int:
    from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin

    runner = SimpleNamespace(
        max_running_requests=2,
        req_to_token_pool=None,
        server_args=server_args,
        mambaish_config=None,
        model_config=ModelConfig(),
        device="cpu",
    )
    with pytest.raises(StopAfterReqToTokenPool):
        ModelRunnerKVCacheMixin._init_pools(runner)
    return runner.req_to_token_pool.req_to_token.shape[1]


@pytest.mark.parametrize("budget, width", [(1, 4096 + 4 + 8), (3, 4096 + 4 + 8), (32, 4096 + 4 + 33)])
def test_req_to_token_rows_hold_the_draft_block_and_the_tree(patched_sglang, models, budget, width):
    args = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", str(budget), "--speculative-ddtree-topk", "4"))
    assert req_to_token_width(args) == width


def test_req_to_token_rows_unchanged_for_linear_dflash(patched_sglang, models):
    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert req_to_token_width(args) == 4096 + 4 + 8


def decode_reserve(server_args, num_reqs: int, monkeypatch) -> int:
    from sglang.srt.managers import schedule_batch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    monkeypatch.setattr(schedule_batch, "get_global_server_args", lambda: server_args)
    batch = SimpleNamespace(
        token_to_kv_pool_allocator=SimpleNamespace(page_size=1),
        reqs=[SimpleNamespace(kv_committed_len=10)] * num_reqs,
        spec_algorithm=SpeculativeAlgorithm.DFLASH,
        is_spec_v2=False,
    )
    return schedule_batch.ScheduleBatch.new_tokens_required_next_decode(batch)


@pytest.mark.parametrize("budget, per_request", [(2, 8), (7, 8), (16, 17)])
def test_decode_memory_check_reserves_the_draft_block(patched_sglang, models, monkeypatch, budget, per_request):
    args = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", str(budget)))
    assert decode_reserve(args, 3, monkeypatch) == 3 * per_request


def test_decode_memory_check_unchanged_for_linear_dflash(patched_sglang, models, monkeypatch):
    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert decode_reserve(args, 3, monkeypatch) == 3 * 8
