"""The DDTree budget schedule through the real patched ServerArgs, and its split into the target's
verify CUDA-graph runners (schedule_graphs.py) around SGLang's own batch-size list."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from server_args_support import cli, parse

SCHEDULE = "1:32/8,4:16/4,16:8/4,64:0"


def schedule_args(models, *extra):
    return parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton", *extra))


def test_schedule_flag_resolves_every_bucket_and_sizes_for_the_largest(patched_sglang, models):
    from k26_ddtree.sglang.common.args import DDTreeConfig, DDTreeSchedule
    from k26_ddtree.sglang.v0_5_11.args import step_slots_per_request

    args = schedule_args(models, "--speculative-ddtree-budget-schedule", SCHEDULE, "--speculative-ddtree-spine")
    schedule = DDTreeSchedule.from_server_args(args)
    assert [(b.min_bs, b.config, b.verify_width) for b in schedule.buckets] == [
        (1, DDTreeConfig(32, 8, True, 8), 33),
        (4, DDTreeConfig(16, 4, True, 8), 17),
        (16, DDTreeConfig(8, 4, True, 8), 9),
        (64, None, 8),
    ]
    assert args.speculative_num_draft_tokens == 33 and args.speculative_dflash_block_size == 8
    assert step_slots_per_request(args) == 33
    assert [schedule.index(bs) for bs in (0, 1, 3, 4, 15, 16, 63, 64, 500)] == [0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert schedule.describe().startswith("bs 1-3: budget 32 topk 8 spine True; bs 4-15: ")
    assert schedule.describe().endswith("bs 64+: DFlash chain")


def test_ddtree_spelling_takes_a_schedule_and_resolution_is_idempotent(patched_sglang, models):
    from sglang.srt.server_args import ServerArgs

    args = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                     "--speculative-ddtree-budget-schedule", "1:8/4,8:0"))
    assert args.speculative_ddtree_budget is None, "the schedule replaces the default budget"
    assert args.speculative_num_draft_tokens == 9
    again = ServerArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerArgs)})
    assert (again.speculative_num_draft_tokens, again.speculative_dflash_block_size) == (9, 8)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--speculative-ddtree-budget-schedule", "2:8/4"], "must start at batch size 1, got 2"),
        (["--speculative-ddtree-budget-schedule", "1:8/4,16:8/4,4:8/4"], "must increase, got 1, 16, 4"),
        (["--speculative-ddtree-budget-schedule", "1:8/4,1:16/4"], "must increase"),
        (["--speculative-ddtree-budget-schedule", "1:8/1"], "bucket 1:8/1: .*larger than the 7 distinct"),
        (["--speculative-ddtree-budget-schedule", "1:8/4,4:30/21"], "bucket 4:30/21: .*too wide"),
        (["--speculative-ddtree-budget-schedule", "1:8/4,4:12/21"], "topk 21 above budget 12"),
        (["--speculative-ddtree-budget-schedule", "1:8/4,4:16"], r"'4:16' is not bs:budget/topk or bs:0"),
        (["--speculative-ddtree-budget-schedule", "1:8/4,,4:0"], r"'' is not bs:budget/topk"),
        (["--speculative-ddtree-budget-schedule", "1:8/0"], "budget and topk must be >= 1"),
        (["--speculative-ddtree-budget-schedule", f"1:8/4,{'9' * 30}:0"], "a number of more than 18 digits"),
        (["--speculative-ddtree-budget-schedule", "1:8/\u0664"], "is not bs:budget/topk or bs:0"),
        (["--speculative-ddtree-budget-schedule", "1:0,8:0"], "every bucket is the chain, which is linear DFLASH"),
        (["--speculative-ddtree-budget-schedule", "1:8/4", "--speculative-ddtree-budget", "8"], "give the schedule alone"),
        (["--speculative-ddtree-budget-schedule", "1:8/4", "--speculative-ddtree-topk", "4"], "give the schedule alone"),
        (["--speculative-ddtree-budget-schedule", "1:8/4", "--speculative-num-draft-tokens", "9"],
         "derived from it"),
        (["--speculative-ddtree-budget-schedule", "1:8/4", "--page-size", "16"], "--page-size 1"),
    ],
)
def test_bad_schedules_fail_the_parse_in_one_line(patched_sglang, models, extra, message):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match=message) as err:
        schedule_args(models, *extra)
    assert "\n" not in str(err.value)


def test_schedule_needs_dflash(patched_sglang, models):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match="needs --speculative-algorithm DFLASH"):
        parse(cli(models, "--speculative-algorithm", "EAGLE", "--speculative-ddtree-budget-schedule", "1:8/4"))


def test_memory_estimate_takes_the_largest_tree(patched_sglang, models):
    from k26_ddtree.sglang.v0_5_11.args import verify_reserved_mem_mb

    one = schedule_args(models, "--speculative-ddtree-budget", "32", "--speculative-ddtree-topk", "8")
    scheduled = schedule_args(models, "--speculative-ddtree-budget-schedule", "1:32/8,4:8/4,16:0")
    assert verify_reserved_mem_mb(scheduled, 1000, 4096) == verify_reserved_mem_mb(one, 1000, 4096)


def test_memory_estimate_counts_a_chain_bucket_s_block(patched_sglang, models):
    from k26_ddtree.sglang.v0_5_11.args import verify_reserved_mem_mb

    # The chain bucket verifies the block's 16 tokens per request, more than the tree's 3.
    scheduled = schedule_args(models, "--speculative-ddtree-budget-schedule", "1:2/1,4:0",
                              "--speculative-dflash-block-size", "16")
    assert scheduled.speculative_num_draft_tokens == 16
    one = schedule_args(models, "--speculative-ddtree-budget", "15", "--speculative-ddtree-topk", "4",
                        "--speculative-dflash-block-size", "16")
    assert verify_reserved_mem_mb(scheduled, 1000, 4096) == verify_reserved_mem_mb(one, 1000, 4096)


def schedule_of(text, block=8):
    from k26_ddtree.sglang.common.args import DDTreeSchedule

    return DDTreeSchedule.from_server_args(SimpleNamespace(
        speculative_algorithm="DFLASH", speculative_ddtree_budget=None, speculative_ddtree_topk=None,
        speculative_ddtree_budget_schedule=text, speculative_ddtree_spine=False, speculative_dflash_block_size=block,
    ))


@pytest.mark.parametrize(
    "text, sizes, per_bucket",
    [
        (SCHEDULE, [1, 2, 4, 8, 16, 32, 64], [[1, 2, 3], [4, 8, 15], [16, 32, 63], [64]]),
        ("1:8/4,6:16/4", [1, 2, 4, 8, 16], [[1, 2, 4, 5], [8, 16]]),
        ("1:8/4,100:0", [1, 2, 4], [[1, 2, 4], []]),
        ("1:8/4,2:0", [], [[], []]),
    ],
)
def test_every_bucket_captures_its_last_batch_size(text, sizes, per_bucket):
    """A batch is padded up to the next captured size, which must stay in the batch's bucket."""
    assert schedule_of(text).graph_batch_sizes(sizes) == per_bucket


def test_runners_split_by_token_count_not_by_bucket():
    from k26_ddtree.sglang.v0_5_11.schedule_graphs import runner_batch_sizes

    # Buckets 1 and 3 both verify 9 tokens: one runner holds both ranges.
    schedule = schedule_of("1:8/4,4:16/4,16:8/4")
    assert runner_batch_sizes(schedule, [1, 2, 4, 8, 16, 32]) == {9: [1, 2, 3, 16, 32], 17: [4, 8, 15]}


class FakeRunner:
    """Stands in for SGLang's CudaGraphRunner, which captures on a GPU; records how it was built."""

    def __init__(self, model_runner, attn_backend=None, speculative_num_draft_tokens=None, batch_sizes=None):
        self.model_runner = model_runner
        self.attn_backend = attn_backend
        self.tokens = speculative_num_draft_tokens
        self.batch_sizes = batch_sizes
        self.replayed = []
        self.bs = None

    def can_run(self, forward_batch):
        return forward_batch.batch_size <= self.batch_sizes[-1]

    def replay(self, forward_batch, **kwargs):
        self.bs = next(b for b in self.batch_sizes if b >= forward_batch.batch_size)
        self.replayed.append((forward_batch.batch_size, kwargs))
        return "out"


def test_target_gets_one_runner_per_token_count_each_with_its_own_backend(patched_sglang, models, monkeypatch):
    from k26_ddtree.sglang.v0_5_11 import schedule_graphs
    from sglang.srt.layers.attention import triton_backend
    from sglang.srt.model_executor import cuda_graph_runner
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    class Backend(triton_backend.TritonAttnBackend):
        def __init__(self, model_runner):
            self.num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens

    monkeypatch.setattr(triton_backend, "TritonAttnBackend", Backend)
    # Set by SGLang's distributed start-up, which this test does not run.
    monkeypatch.setattr(cuda_graph_runner, "get_attention_cp_size", lambda: 1)
    args = schedule_args(models, "--speculative-ddtree-budget-schedule", SCHEDULE,
                         "--cuda-graph-bs", "1", "2", "4", "8", "16", "32", "64")
    model_runner = SimpleNamespace(server_args=args, is_draft_worker=False, attn_backend=Backend(SimpleNamespace(
        server_args=args)), req_to_token_pool=SimpleNamespace(size=64))
    runner = schedule_graphs.graph_runner(model_runner, FakeRunner)
    assert {t: r.batch_sizes for t, r in runner.runners.items()} == {
        33: [1, 2, 3], 17: [4, 8, 15], 9: [16, 32, 63], 8: [64]}
    assert all(r.attn_backend.num_draft_tokens == t and r.tokens == t for t, r in runner.runners.items())
    assert len({id(r.attn_backend) for r in runner.runners.values()} | {id(model_runner.attn_backend)}) == 5

    def batch(bs, tokens):
        spec = DFlashVerifyInput(draft_token=None, positions=None, draft_token_num=tokens)
        return SimpleNamespace(batch_size=bs, spec_info=spec)

    assert runner.can_run(batch(3, 33)) and runner.can_run(batch(10, 17)) and runner.can_run(batch(64, 8))
    assert not runner.can_run(batch(70, 8)), "past the largest captured size: eager"
    assert not runner.can_run(batch(2, 5)), "a count no runner holds: eager"
    assert runner.replay(batch(10, 17), skip_attn_backend_init=True) == "out"
    assert runner.runners[17].replayed == [(10, {"skip_attn_backend_init": True})] and runner.bs == 15

    plain = schedule_args(models, "--speculative-ddtree-budget", "8")
    assert isinstance(schedule_graphs.graph_runner(SimpleNamespace(server_args=plain, is_draft_worker=False),
                                                   FakeRunner), FakeRunner)
    assert isinstance(schedule_graphs.graph_runner(SimpleNamespace(server_args=args, is_draft_worker=True),
                                                   FakeRunner), FakeRunner), "the draft keeps one runner"
