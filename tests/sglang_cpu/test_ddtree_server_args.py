"""DDTree flags through the real patched ServerArgs: parsing, validation, the target/draft split."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from server_args_support import cli, parse

def test_flags_turn_ddtree_on_and_split_target_from_draft(patched_sglang, models):
    from k26_ddtree.sglang.args import DDTreeConfig, apply_to_draft_args, draft_block_size

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", "16", "--speculative-ddtree-topk", "8"))
    assert args.speculative_algorithm == "DFLASH"
    assert args.speculative_num_draft_tokens == 17
    assert args.speculative_dflash_block_size == 8
    assert DDTreeConfig.from_server_args(args) == DDTreeConfig(budget=16, topk=8, spine=False, block_size=8)
    assert draft_block_size(args) == 8

    draft_args = copy.deepcopy(args)
    apply_to_draft_args(draft_args)
    assert draft_args.speculative_num_draft_tokens == 8
    assert args.speculative_num_draft_tokens == 17, "the draft copy must not leak into the target"


def test_ddtree_spelling_means_dflash_with_defaults(patched_sglang, models):
    args = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                     "--speculative-ddtree-spine"))
    assert args.speculative_algorithm == "DFLASH"
    assert (args.speculative_ddtree_budget, args.speculative_ddtree_topk) == (8, 4)
    assert args.speculative_ddtree_spine is True
    assert args.speculative_num_draft_tokens == 9


def test_linear_dflash_is_untouched(patched_sglang, models):
    from k26_ddtree.sglang.args import DDTreeConfig, draft_block_size

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert args.speculative_num_draft_tokens == 8
    assert args.speculative_ddtree_budget is None
    assert DDTreeConfig.from_server_args(args) is None
    assert draft_block_size(args) == 8


def test_explicit_block_size_and_matching_num_draft_tokens(patched_sglang, models):
    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-dflash-block-size", "4", "--speculative-num-draft-tokens", "13",
                     "--speculative-ddtree-budget", "12", "--speculative-ddtree-topk", "3"))
    assert (args.speculative_dflash_block_size, args.speculative_num_draft_tokens) == (4, 13)


@pytest.mark.parametrize("budget, topk", [(1, 1), (2, 1), (3, 4), (4, 4)])
def test_budgets_below_the_block_are_accepted(patched_sglang, models, budget, topk):
    from k26_ddtree.sglang.args import req_to_token_extra, tokens_per_request_step

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", str(budget), "--speculative-ddtree-topk", str(topk)))
    assert (args.speculative_num_draft_tokens, args.speculative_dflash_block_size) == (budget + 1, 8)
    # The draft block (8 slots) is claimed before the smaller tree, in the same req_to_token row.
    assert tokens_per_request_step(args) == 8
    assert req_to_token_extra(args) == 4 + 8


def test_budget_without_a_block_size_flag_on_a_small_block(patched_sglang, models):
    from k26_ddtree.sglang.args import req_to_token_extra

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-dflash-block-size", "16", "--speculative-ddtree-budget", "2"))
    assert (args.speculative_num_draft_tokens, args.speculative_dflash_block_size) == (3, 16)
    assert req_to_token_extra(args) == 4 + 16


@pytest.mark.parametrize("budget, extra", [(7, 4 + 8), (16, 4 + 17), (64, 4 + 65)])
def test_req_to_token_extra_covers_the_larger_of_tree_and_block(patched_sglang, models, budget, extra):
    from k26_ddtree.sglang.args import apply_to_draft_args, req_to_token_extra

    args = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", str(budget)))
    assert req_to_token_extra(args) == extra
    draft_args = copy.deepcopy(args)
    apply_to_draft_args(draft_args)
    # A compact draft cache (draft window) sizes its own rows from the draft args: the block.
    assert req_to_token_extra(draft_args) == 4 + 8


def test_req_to_token_extra_is_sglangs_own_without_ddtree(patched_sglang, models):
    from k26_ddtree.sglang.args import req_to_token_extra, tokens_per_request_step

    linear = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert (req_to_token_extra(linear), tokens_per_request_step(linear)) == (4 + 8, 8)
    plain = parse(cli(models))
    assert req_to_token_extra(plain) == 4


def test_resolution_is_idempotent(patched_sglang, models):
    from sglang.srt.server_args import ServerArgs

    args = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", "32", "--speculative-ddtree-topk", "4"))
    again = ServerArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerArgs)})
    assert (again.speculative_num_draft_tokens, again.speculative_dflash_block_size) == (33, 8)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--speculative-ddtree-budget", "0"], "must be >= 1"),
        (["--speculative-ddtree-budget", "4", "--speculative-ddtree-topk", "0"], "must be >= 1"),
        (["--speculative-ddtree-budget", "8", "--speculative-ddtree-topk", "1"], "larger than the 7 distinct"),
        (["--speculative-ddtree-budget", "64", "--speculative-ddtree-topk", "2",
          "--speculative-dflash-block-size", "6"], "larger than the 62 distinct"),
        (["--speculative-ddtree-budget", "12", "--speculative-ddtree-topk", "21"], "too wide for a tree of 7 levels"),
        (["--speculative-ddtree-topk", "4"], "need --speculative-ddtree-budget"),
        (["--speculative-ddtree-spine"], "need --speculative-ddtree-budget"),
        (["--speculative-ddtree-budget", "8", "--speculative-num-draft-tokens", "8"], r"budget \+ 1 = 9"),
        (["--speculative-ddtree-budget", "8", "--page-size", "16"], "--page-size 1"),
    ],
)
def test_bad_flags_are_rejected_with_a_clear_message(patched_sglang, models, extra, message):
    from k26_ddtree.sglang.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match=message):
        parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton", *extra))


@pytest.mark.parametrize("backend", ["flashinfer", "fa3", "torch_native"])
def test_attention_backend_other_than_triton_is_rejected(patched_sglang, models, backend):
    from k26_ddtree.sglang.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match="--attention-backend triton"):
        parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", backend))


def test_mixed_prefill_decode_backends_are_rejected(patched_sglang, models):
    from k26_ddtree.sglang.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match="--attention-backend triton"):
        parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                  "--decode-attention-backend", "flashinfer"))


def test_budget_needs_dflash(patched_sglang, models):
    from k26_ddtree.sglang.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match="needs --speculative-algorithm DFLASH"):
        parse(cli(models, "--speculative-algorithm", "EAGLE", "--speculative-ddtree-budget", "8"))


def test_hybrid_models_and_oversized_topk_are_rejected():
    from types import SimpleNamespace

    from k26_ddtree.sglang.args import DDTreeArgsError, check_target_runner

    check_target_runner(SimpleNamespace(mambaish_config=None), vocab_size=1000, topk=8)
    with pytest.raises(DDTreeArgsError, match="hybrid Mamba"):
        check_target_runner(SimpleNamespace(mambaish_config=object()), vocab_size=1000, topk=8)
    with pytest.raises(DDTreeArgsError, match="exceeds the vocabulary"):
        check_target_runner(SimpleNamespace(mambaish_config=None), vocab_size=4, topk=8)


def test_memory_estimate_grows_with_the_budget(patched_sglang, models):
    from k26_ddtree.sglang.args import verify_reserved_mem_mb

    small = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                      "--speculative-ddtree-budget", "8"))
    large = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                      "--speculative-ddtree-budget", "64"))
    linear = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    est = [verify_reserved_mem_mb(a, vocab_size=163840, context_len=32768) for a in (small, large)]
    assert est[1] / est[0] == pytest.approx(65 / 9)
    assert large.mem_fraction_static < small.mem_fraction_static <= linear.mem_fraction_static
