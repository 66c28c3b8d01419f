"""DDTree flags through SGLang 0.5.17's real patched ServerArgs: parsing, validation, the counts."""

from __future__ import annotations

import dataclasses

import pytest

from v0517_support import cli, ddtree_cli, parse


def test_flags_turn_ddtree_on_and_the_target_count_holds_tree_and_block(patched_sglang, models):
    from k26_ddtree.sglang.common.args import DDTreeConfig, DDTreeSchedule

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-ddtree-budget", "16", "--speculative-ddtree-topk", "8"))
    assert args.speculative_algorithm == "DFLASH"
    assert (args.speculative_num_draft_tokens, args.speculative_dflash_block_size) == (17, 8)
    (bucket,) = DDTreeSchedule.from_server_args(args).buckets
    assert bucket.config == DDTreeConfig(budget=16, topk=8, spine=False, block_size=8) and bucket.min_bs == 1


def test_ddtree_spelling_means_dflash_with_defaults(patched_sglang, models):
    args = parse(ddtree_cli(models, "--speculative-ddtree-spine"))
    assert args.speculative_algorithm == "DFLASH"
    assert (args.speculative_ddtree_budget, args.speculative_ddtree_topk, args.speculative_ddtree_spine) == (8, 4, True)
    assert args.speculative_num_draft_tokens == 9


@pytest.mark.parametrize("budget, topk", [(1, 1), (3, 4), (6, 4)])
def test_a_tree_smaller_than_the_block_still_reserves_the_block(patched_sglang, models, budget, topk):
    """The draft block and the tree share one row past the prefix: the count SGLang reserves and
    sizes rows with is the larger of the two."""
    args = parse(ddtree_cli(models, "--speculative-ddtree-budget", str(budget), "--speculative-ddtree-topk",
                            str(topk)))
    assert (args.speculative_num_draft_tokens, args.speculative_dflash_block_size) == (8, 8)
    assert args.max_speculative_num_draft_tokens == 8


def test_schedule_counts_its_widest_bucket(patched_sglang, models):
    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton",
                     "--speculative-dflash-block-size", "8", "--speculative-ddtree-budget-schedule", "1:32/8,4:4/2,16:0"))
    assert (args.speculative_num_draft_tokens, args.speculative_dflash_block_size) == (33, 8)


def test_linear_dflash_is_untouched(patched_sglang, models):
    from k26_ddtree.sglang.common.args import DDTreeSchedule

    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert args.speculative_num_draft_tokens == 8
    assert args.speculative_ddtree_budget is None
    assert DDTreeSchedule.from_server_args(args) is None


@pytest.mark.parametrize("budget, count", [(4, 8), (32, 33)])
def test_resolution_is_idempotent(patched_sglang, models, budget, count):
    from sglang.srt.server_args import ServerArgs

    args = parse(ddtree_cli(models, "--speculative-ddtree-budget", str(budget)))
    again = ServerArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerArgs)})
    assert (again.speculative_num_draft_tokens, again.speculative_dflash_block_size) == (count, 8)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--speculative-ddtree-budget", "0"], "must be >= 1"),
        (["--speculative-ddtree-budget", "4", "--speculative-ddtree-topk", "0"], "must be >= 1"),
        (["--speculative-ddtree-budget", "8", "--speculative-ddtree-topk", "1"], "larger than the 7 distinct"),
        (["--speculative-ddtree-budget", "12", "--speculative-ddtree-topk", "21"], "too wide for a tree of 7 levels"),
        (["--speculative-ddtree-topk", "4"], "need --speculative-ddtree-budget"),
        (["--speculative-ddtree-spine"], "need --speculative-ddtree-budget"),
        (["--speculative-ddtree-budget", "8", "--speculative-num-draft-tokens", "8"], r"budget \+ 1 = 9"),
        (["--speculative-ddtree-budget", "8", "--page-size", "16"], "--page-size 1"),
        (["--speculative-ddtree-budget-schedule", "1:8/4,1:4/2"], "--speculative-ddtree-budget-schedule"),
        (["--speculative-ddtree-budget-schedule", "1:8/4", "--speculative-ddtree-budget", "8"], "give the schedule alone"),
        (["--speculative-ddtree-trace", "t.trace"], "needs DDTree on"),
    ],
)
def test_bad_flags_are_rejected_in_one_line(patched_sglang, models, tmp_path, monkeypatch, extra, message):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DDTreeArgsError, match=message) as err:
        parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton", *extra))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("backends", [["--attention-backend", "flashinfer"], ["--attention-backend", "fa3"],
                                      ["--attention-backend", "triton", "--decode-attention-backend", "flashinfer"]])
def test_attention_backends_other_than_triton_are_rejected(patched_sglang, models, backends):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match="--attention-backend triton"):
        parse(cli(models, "--speculative-algorithm", "DDTREE", *backends))


def test_budget_needs_dflash(patched_sglang, models):
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    with pytest.raises(DDTreeArgsError, match="needs --speculative-algorithm DFLASH"):
        parse(cli(models, "--speculative-algorithm", "EAGLE", "--speculative-ddtree-budget", "8"))


def test_trace_flag_gives_an_absolute_path_and_the_default_cap(patched_sglang, models, tmp_path, monkeypatch):
    monkeypatch.delenv("K26_DDTREE_TRACE", raising=False)
    monkeypatch.chdir(tmp_path)
    args = parse(ddtree_cli(models, "--speculative-ddtree-trace", "steps.trace"))
    assert (args.speculative_ddtree_trace, args.speculative_ddtree_trace_max_mb) == (str(tmp_path / "steps.trace"), 1024)
    assert not (tmp_path / "steps.trace").exists(), "the worker creates the file, not the parse"
    monkeypatch.setenv("K26_DDTREE_TRACE", str(tmp_path / "env.trace"))
    assert parse(ddtree_cli(models)).speculative_ddtree_trace == str(tmp_path / "env.trace")


def test_bad_trace_path_fails_the_parse_in_one_line(patched_sglang, models, tmp_path):
    from k26_ddtree.sglang.common import trace
    from k26_ddtree.sglang.common.args import DDTreeArgsError

    other_depth = tmp_path / "depth3.trace"
    other_depth.write_bytes(trace.header_bytes({"depth": 3}))
    with pytest.raises(DDTreeArgsError, match="--speculative-ddtree-trace: .*draft depth 3, this server drafts 7"):
        parse(ddtree_cli(models, "--speculative-ddtree-trace", str(other_depth)))


def test_help_lists_every_ddtree_flag(patched_sglang):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    text = parser.format_help()
    for flag in ("budget", "topk", "budget-schedule", "spine", "trace", "trace-max-mb"):
        assert f"--speculative-ddtree-{flag} " in text or f"--speculative-ddtree-{flag}\n" in text
    assert parser.parse_args(["--model-path", "m", "--speculative-ddtree-spine"]).speculative_ddtree_spine is True
