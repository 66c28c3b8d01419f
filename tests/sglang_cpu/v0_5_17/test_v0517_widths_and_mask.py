"""Tokens per request per role and the verify-mask policy, through SGLang 0.5.17's own derivation
points (spec_utils.resolve_num_tokens_per_req, dflash_utils.resolve_dflash_verify_mask_policy,
DecodeCudaGraphRunner.get_spec_info)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from v0517_support import cli, ddtree_cli, parse


def widths(args):
    """(target graph width, draft graph width) as SGLang derives them, from the spec bag's N."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req

    return tuple(
        resolve_num_tokens_per_req(phase="target_verify", server_args=args, spec_algorithm=SpeculativeAlgorithm.DFLASH,
                                   is_draft_worker=draft, num_draft_tokens=args.speculative_num_draft_tokens)
        for draft in (False, True)
    )


@pytest.mark.parametrize("flags, count, target, draft", [
    (["--speculative-ddtree-budget", "16"], 17, 17, 8),
    (["--speculative-ddtree-budget", "4", "--speculative-ddtree-topk", "2"], 8, 5, 8),
    (["--speculative-ddtree-budget", "7"], 8, 8, 8),
    (["--speculative-dflash-block-size", "8", "--speculative-ddtree-budget-schedule", "1:32/8,4:4/2,16:0"], 33, 33, 8),
    (["--speculative-dflash-block-size", "8", "--speculative-ddtree-budget-schedule", "1:4/2,8:0"], 8, 8, 8),
])
def test_the_target_graphs_hold_the_widest_tree_and_the_draft_graphs_the_block(patched_sglang, models, flags, count,
                                                                                target, draft):
    args = parse(ddtree_cli(models, *flags))
    assert args.speculative_num_draft_tokens == count, "the reservation and row width hold tree and block"
    assert widths(args) == (target, draft)


def test_linear_dflash_widths_are_sglangs(patched_sglang, models):
    args = parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert widths(args) == (8, 8)


def named(name):
    return type(name, (), {})()


def publish(args):
    from sglang.srt.runtime_context import get_context

    get_context().set_server_args(args)


@pytest.mark.parametrize("backend, ddtree, linear", [
    ("TritonAttnBackend", True, False),
    ("FlashInferAttnBackend", False, False),
    ("TorchNativeAttnBackend", True, True),
])
def test_only_ddtree_turns_the_triton_verify_mask_on(patched_sglang, models, backend, ddtree, linear):
    from sglang.srt.speculative.dflash_utils import resolve_dflash_verify_mask_policy

    publish(parse(ddtree_cli(models, "--speculative-ddtree-budget", "16")))
    assert resolve_dflash_verify_mask_policy(named(backend)) == (backend, ddtree)
    publish(parse(cli(models, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton")))
    assert resolve_dflash_verify_mask_policy(named(backend)) == (backend, linear)


def test_hybrid_wrappers_are_seen_through(patched_sglang, models):
    from sglang.srt.speculative.dflash_utils import resolve_dflash_verify_mask_policy

    publish(parse(ddtree_cli(models)))
    wrapper = SimpleNamespace(full_attn_backend=named("TritonAttnBackend"))
    assert resolve_dflash_verify_mask_policy(wrapper) == ("TritonAttnBackend", True)


@pytest.mark.parametrize("is_draft_worker, masked", [(False, True), (True, False)])
def test_the_target_verify_graph_is_captured_reading_the_mask(patched_sglang, models, is_draft_worker, masked):
    """The capture-time verify input of SGLang's graph runner: the target's carries the mask
    buffer (so the graph reads it at every replay); the draft's none."""
    import torch

    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    args = parse(ddtree_cli(models, "--speculative-ddtree-budget", "16"))
    publish(args)
    mask = torch.ones(4, dtype=torch.bool)
    runner = SimpleNamespace(
        model_runner=SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.DFLASH, is_draft_worker=is_draft_worker,
                                     attn_backend=named("TritonAttnBackend"), server_args=args),
        buffers=SimpleNamespace(custom_mask=mask), captured_req_width=widths(args)[is_draft_worker],
        ragged_verify_mode=False, _capture_ragged_verify_layout=lambda num_tokens: None,
    )
    spec_info = DecodeCudaGraphRunner.get_spec_info(runner, num_tokens=17)
    assert spec_info.draft_token_num == (8 if is_draft_worker else 17)
    assert (spec_info.custom_mask is mask) == masked
