"""DDTree flags through the real patched ServerArgs: parsing, validation, the target/draft split."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from server_args_support import cli, parse

def test_flags_turn_ddtree_on_and_split_target_from_draft(patched_sglang, models):
    from k26_ddtree.sglang.common.args import DDTreeConfig, DDTreeSchedule, draft_block_size
    from k26_ddtree.sglang.v0_5_11.args import apply_to_draft_args

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", "16", "--speculative-ddtree-topk", "8"))
    assert args.speculative_algorithm == "DFLASH"
    assert args.speculative_num_draft_tokens == 17
    assert args.speculative_dflash_block_size == 8
    (bucket,) = DDTreeSchedule.from_server_args(args).buckets
    assert bucket.config == DDTreeConfig(budget=16, topk=8, spine=False, block_size=8) and bucket.min_bs == 1
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
    from k26_ddtree.sglang.common.args import DDTreeSchedule, draft_block_size

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert args.speculative_num_draft_tokens == 8
    assert args.speculative_ddtree_budget is None
    assert DDTreeSchedule.from_server_args(args) is None
    assert draft_block_size(args) == 8


def test_explicit_block_size_and_matching_num_draft_tokens(patched_sglang, models):
    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-dflash-block-size", "4", "--speculative-num-draft-tokens", "13",
                     "--speculative-ddtree-budget", "12", "--speculative-ddtree-topk", "3"))
    assert (args.speculative_dflash_block_size, args.speculative_num_draft_tokens) == (4, 13)


@pytest.mark.parametrize("budget, topk", [(1, 1), (2, 1), (3, 4), (4, 4)])
def test_budgets_below_the_block_are_accepted(patched_sglang, models, budget, topk):
    from k26_ddtree.sglang.v0_5_11.args import req_to_token_extra, step_slots_per_request

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", str(budget), "--speculative-ddtree-topk", str(topk)))
    assert (args.speculative_num_draft_tokens, args.speculative_dflash_block_size) == (budget + 1, 8)
    # The draft block (8 slots) is claimed before the smaller tree, in the same req_to_token row.
    assert step_slots_per_request(args) == 8
    assert req_to_token_extra(args) == 4 + 8


def test_budget_without_a_block_size_flag_on_a_small_block(patched_sglang, models):
    from k26_ddtree.sglang.v0_5_11.args import req_to_token_extra

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-dflash-block-size", "16", "--speculative-ddtree-budget", "2"))
    assert (args.speculative_num_draft_tokens, args.speculative_dflash_block_size) == (3, 16)
    assert req_to_token_extra(args) == 4 + 16


@pytest.mark.parametrize("budget, extra", [(7, 4 + 8), (16, 4 + 17), (64, 4 + 65)])
def test_req_to_token_extra_covers_the_larger_of_tree_and_block(patched_sglang, models, budget, extra):
    from k26_ddtree.sglang.v0_5_11.args import apply_to_draft_args, req_to_token_extra

    args = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", str(budget)))
    assert req_to_token_extra(args) == extra
    draft_args = copy.deepcopy(args)
    apply_to_draft_args(draft_args)
    # A compact draft cache (draft window) sizes its own rows from the draft args: the block.
    assert req_to_token_extra(draft_args) == 4 + 8


def test_req_to_token_extra_is_sglangs_own_without_ddtree(patched_sglang, models):
    from k26_ddtree.sglang.v0_5_11.args import req_to_token_extra, step_slots_per_request

    linear = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert (req_to_token_extra(linear), step_slots_per_request(linear)) == (4 + 8, 8)
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
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match=message):
        parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton", *extra))


@pytest.mark.parametrize("backend", ["flashinfer", "fa3", "torch_native"])
def test_attention_backend_other_than_triton_is_rejected(patched_sglang, models, backend):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match="--attention-backend triton"):
        parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", backend))


def test_mixed_prefill_decode_backends_are_rejected(patched_sglang, models):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match="--attention-backend triton"):
        parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                  "--decode-attention-backend", "flashinfer"))


def test_budget_needs_dflash(patched_sglang, models):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match="needs --speculative-algorithm DFLASH"):
        parse(cli(models, "--speculative-algorithm", "EAGLE", "--speculative-ddtree-budget", "8"))


def test_hybrid_models_and_oversized_topk_are_rejected():
    from types import SimpleNamespace

    from k26_ddtree.sglang.common.args import DDTreeArgsError
    from k26_ddtree.sglang.v0_5_11.args import check_target_runner

    check_target_runner(SimpleNamespace(mambaish_config=None), vocab_size=1000, topk=8)
    with pytest.raises(DDTreeArgsError, match="hybrid Mamba"):
        check_target_runner(SimpleNamespace(mambaish_config=object()), vocab_size=1000, topk=8)
    with pytest.raises(DDTreeArgsError, match="exceeds the vocabulary"):
        check_target_runner(SimpleNamespace(mambaish_config=None), vocab_size=4, topk=8)


def test_memory_estimate_grows_with_the_budget(patched_sglang, models):
    from k26_ddtree.sglang.v0_5_11.args import verify_reserved_mem_mb

    small = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                      "--speculative-ddtree-budget", "8"))
    large = parse(cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton",
                      "--speculative-ddtree-budget", "64"))
    linear = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    est = [verify_reserved_mem_mb(a, vocab_size=163840, context_len=32768) for a in (small, large)]
    assert est[1] / est[0] == pytest.approx(65 / 9)
    assert large.mem_fraction_static < small.mem_fraction_static <= linear.mem_fraction_static


def ddtree_cli(models, *extra):
    return cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton", *extra)


def test_trace_flag_gives_an_absolute_path_and_the_default_cap(patched_sglang, models, tmp_path, monkeypatch):
    monkeypatch.delenv("K26_DDTREE_TRACE", raising=False)
    monkeypatch.chdir(tmp_path)
    args = parse(ddtree_cli(models, "--speculative-ddtree-trace", "steps.trace"))
    assert args.speculative_ddtree_trace == str(tmp_path / "steps.trace")
    assert args.speculative_ddtree_trace_max_mb == 1024
    assert not (tmp_path / "steps.trace").exists(), "the worker creates the file, not the parse"
    assert parse(ddtree_cli(models)).speculative_ddtree_trace is None


def test_trace_environment_variable_is_the_fallback(patched_sglang, models, tmp_path, monkeypatch):
    monkeypatch.setenv("K26_DDTREE_TRACE", str(tmp_path / "env.trace"))
    assert parse(ddtree_cli(models)).speculative_ddtree_trace == str(tmp_path / "env.trace")
    flag = parse(ddtree_cli(models, "--speculative-ddtree-trace", str(tmp_path / "flag.trace")))
    assert flag.speculative_ddtree_trace == str(tmp_path / "flag.trace")
    linear = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert linear.speculative_ddtree_trace is None, "the variable only matters with DDTree on"


def test_trace_appends_to_an_empty_file_or_a_whole_trace_of_the_same_depth(patched_sglang, models, tmp_path):
    from k26_ddtree.sglang.common import trace

    empty = tmp_path / "empty.trace"
    empty.touch()
    assert parse(ddtree_cli(models, "--speculative-ddtree-trace", str(empty))).speculative_ddtree_trace == str(empty)
    same = tmp_path / "same.trace"
    same.write_bytes(trace.header_bytes({"depth": 7}) + bytes(2 * trace.record_size(7)))
    assert parse(ddtree_cli(models, "--speculative-ddtree-trace", str(same))).speculative_ddtree_trace == str(same)


def bad_trace_paths(tmp_path):
    from k26_ddtree.sglang.common import trace

    other_depth = tmp_path / "depth3.trace"
    other_depth.write_bytes(trace.header_bytes({"depth": 3}))
    truncated = tmp_path / "cut.trace"
    truncated.write_bytes(trace.header_bytes({"depth": 7}) + bytes(trace.record_size(7) + 5))
    not_a_trace = tmp_path / "notes.txt"
    not_a_trace.write_text("my notes\n")
    return {
        "missing-folder": (tmp_path / "no" / "t.trace", "the folder of .* does not exist"),
        "folder": (tmp_path, "is a folder, not a trace file"),
        "not-a-trace": (not_a_trace, "notes.txt is not a DDTree trace .*; refusing to append to it"),
        "other-depth": (other_depth, "depth3.trace is a trace of draft depth 3, this server drafts 7 positions"),
        "truncated": (truncated, "cut.trace is truncated: 5 bytes of a partial record"),
    }


@pytest.mark.parametrize("case", ["missing-folder", "folder", "not-a-trace", "other-depth", "truncated"])
def test_bad_trace_paths_fail_the_parse_in_one_line(patched_sglang, models, tmp_path, case):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    path, message = bad_trace_paths(tmp_path)[case]
    with pytest.raises(DDTreeArgsError, match="--speculative-ddtree-trace: .*" + message) as err:
        parse(ddtree_cli(models, "--speculative-ddtree-trace", str(path)))
    assert "\n" not in str(err.value)


def test_bad_trace_path_from_the_environment_names_the_variable(patched_sglang, models, tmp_path, monkeypatch):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    monkeypatch.setenv("K26_DDTREE_TRACE", str(tmp_path / "no" / "t.trace"))
    with pytest.raises(DDTreeArgsError, match="^K26_DDTREE_TRACE: the folder of"):
        parse(ddtree_cli(models))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--speculative-algorithm", "DFLASH", "--speculative-ddtree-trace", "t.trace"], "needs DDTree on"),
        (["--speculative-algorithm", "DDTREE", "--speculative-ddtree-trace-max-mb", "0"], "must be >= 1, got 0"),
    ],
)
def test_bad_trace_flags_are_rejected_with_a_clear_message(patched_sglang, models, tmp_path, monkeypatch, extra,
                                                           message):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DDTreeArgsError, match=message) as err:
        parse(cli(models, "--attention-backend", "triton", *extra))
    assert "\n" not in str(err.value)
