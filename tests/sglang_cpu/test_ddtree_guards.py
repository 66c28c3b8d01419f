"""Tokens-per-request and mask guards, called through the real patched CudaGraphRunner and
TritonAttnBackend methods; and every patched file compiles."""

from __future__ import annotations

import py_compile
from types import SimpleNamespace

import pytest
import torch

from k26_ddtree.patchset.pins import default_root, load


@pytest.mark.parametrize("rel", [pin.rel for pin in load(default_root()).files if pin.rel.endswith(".py")])
def test_patched_file_compiles(rel, patched_sglang, tmp_path):
    py_compile.compile(str(patched_sglang / rel), cfile=str(tmp_path / "out.pyc"), doraise=True)


def dflash_verify(n, custom_mask=None):
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    return DFlashVerifyInput(draft_token=None, positions=None, draft_token_num=n, custom_mask=custom_mask)


def graph_runner(verify_width: int, is_draft: bool):
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    runner = object.__new__(CudaGraphRunner)
    runner.capture_forward_mode = ForwardMode.TARGET_VERIFY
    runner.capture_hidden_mode = CaptureHiddenMode.FULL
    runner.num_tokens_per_bs = verify_width
    runner.model_runner = SimpleNamespace(
        is_draft_worker=is_draft, spec_algorithm=SimpleNamespace(is_ngram=lambda: False)
    )
    runner.require_mlp_tp_gather = False
    runner.require_mlp_sync = False
    runner.record_nolora_graph = False
    runner.enable_pdmux = False
    runner.disable_padding = False
    runner.max_bs = 16
    runner.is_encoder_decoder = False
    runner.enable_two_batch_overlap = False
    return runner


def verify_batch(bs: int, verify_width: int, spec_info):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    return SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=bs,
        input_ids=torch.zeros(bs * verify_width, dtype=torch.long),
        spec_info=spec_info,
        replace_embeds=None,
        capture_hidden_mode=CaptureHiddenMode.NULL,
        lora_ids=None,
    )


def test_graph_runner_runs_matching_verify_batches(patched_sglang):
    runner = graph_runner(17, is_draft=False)
    assert runner.can_run(verify_batch(4, 17, dflash_verify(17))) is True


@pytest.mark.parametrize(
    "is_draft, graph_tokens, batch_tokens, spec_tokens",
    [(False, 17, 8, 8), (True, 8, 17, 17), (False, 17, 17, 8)],
)
def test_graph_runner_refuses_a_verify_width_mismatch(patched_sglang, is_draft, graph_tokens, batch_tokens, spec_tokens):
    from k26_ddtree.sglang.v0_5_11.guards import VerifyShapeError

    runner = graph_runner(graph_tokens, is_draft=is_draft)
    role = "draft" if is_draft else "target"
    with pytest.raises(VerifyShapeError, match=f"{role} verify CUDA graph is built for {graph_tokens} tokens"):
        runner.can_run(verify_batch(3, batch_tokens, dflash_verify(spec_tokens)))


def triton_backend(num_draft_tokens: int, captured_with_mask):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = object.__new__(TritonAttnBackend)
    backend.num_draft_tokens = num_draft_tokens
    backend.cuda_graph_verify_uses_mask = captured_with_mask
    return backend


def replay(backend, spec_info):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend.init_forward_metadata_replay_cuda_graph(
        2, torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.long), 2, None,
        ForwardMode.TARGET_VERIFY, spec_info, seq_lens_cpu=None,
    )


def test_triton_replay_refuses_a_mismatched_verify_input(patched_sglang):
    from k26_ddtree.sglang.v0_5_11.guards import VerifyShapeError

    with pytest.raises(VerifyShapeError, match="graph replay.*sized for 9 .* has 8"):
        replay(triton_backend(9, True), dflash_verify(8, custom_mask=torch.ones(4, dtype=torch.bool)))


def test_triton_replay_refuses_a_missing_or_ignored_mask(patched_sglang):
    from k26_ddtree.sglang.v0_5_11.guards import VerifyShapeError

    with pytest.raises(VerifyShapeError, match="previous step's mask"):
        replay(triton_backend(9, True), dflash_verify(9))
    with pytest.raises(VerifyShapeError, match="would ignore"):
        replay(triton_backend(9, False), dflash_verify(9, custom_mask=torch.ones(4, dtype=torch.bool)))


def test_triton_eager_verify_refuses_a_mismatch(patched_sglang):
    from k26_ddtree.sglang.v0_5_11.guards import VerifyShapeError
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend = triton_backend(9, None)
    backend.kv_indptr = torch.zeros(8, dtype=torch.int32)
    backend.window_kv_indptr = None
    forward_batch = SimpleNamespace(
        batch_size=2, spec_info=dflash_verify(17), forward_mode=ForwardMode.TARGET_VERIFY
    )
    with pytest.raises(VerifyShapeError, match="eager verify"):
        backend.init_forward_metadata(forward_batch)


def test_triton_eager_verify_builds_its_metadata_for_the_inputs_own_count(patched_sglang, monkeypatch):
    """A DDTree schedule's smaller bucket (5 tokens) on a backend sized for its largest (9)."""
    from sglang.srt.layers.attention import triton_backend as module
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, _, out, stride):
        for b, (row, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
            out[int(kv_indptr[b]) : int(kv_indptr[b]) + length] = req_to_token[row, :length]

    monkeypatch.setattr(module, "create_flashinfer_kv_indices_triton", {(2,): kv_indices})  # grid -> kernel
    backend = triton_backend(9, None)
    backend.device = "cpu"
    backend.kv_indptr = torch.zeros(8, dtype=torch.int32)
    backend.mask_indptr = torch.zeros(8, dtype=torch.int64)
    backend.req_to_token = torch.arange(64, dtype=torch.int32).view(4, 16)
    backend.sliding_window_size = None
    backend.window_kv_indptr = None
    seq_lens = torch.tensor([3, 6])
    forward_batch = SimpleNamespace(
        batch_size=2, spec_info=dflash_verify(5, custom_mask=torch.ones(1, dtype=torch.bool)),
        forward_mode=ForwardMode.TARGET_VERIFY, req_pool_indices=torch.tensor([1, 2]), seq_lens=seq_lens,
    )
    backend.init_forward_metadata(forward_batch)
    meta = backend.forward_metadata
    assert meta.qo_indptr.tolist() == [0, 5, 10] and meta.max_extend_len == 5
    assert meta.mask_indptr.tolist() == [0, 5 * (3 + 5), 5 * (3 + 5) + 5 * (6 + 5)]
    assert meta.kv_indices.tolist() == [16, 17, 18, 32, 33, 34, 35, 36, 37]


def test_guards_ignore_other_algorithms():
    from k26_ddtree.sglang.v0_5_11.guards import check_backend_verify_width, check_replay_mask

    eagle_like = SimpleNamespace(spec_input_type=SimpleNamespace(name="EAGLE_VERIFY"), draft_token_num=5)
    check_backend_verify_width("graph replay", 9, eagle_like)
    check_replay_mask(True, eagle_like)


def test_triton_graph_buffers_of_dflash_runners_are_per_request(patched_sglang):
    """Decode-only buffers and kv_indices per request, the custom mask per token and a
    whole req_to_token row wide; other algorithms keep SGLang's per-token sizes."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    def backend(verify_only):
        b = object.__new__(TritonAttnBackend)
        b.cuda_graph_verify_only = verify_only
        b.num_head, b.max_kv_splits, b.v_head_dim, b.swa_v_head_dim = 2, 4, 8, None
        b.device = torch.device("cpu")
        b.max_context_len = 100
        b.req_to_token = torch.zeros(5, 100 + 4 + 17, dtype=torch.int32)
        b.skip_prefill = False
        b.sliding_window_size = None
        return b

    dflash = backend(True)
    dflash.init_cuda_graph_state(4, 4 * 17)
    assert dflash.cuda_graph_attn_logits.shape[0] == 4
    assert dflash.cuda_graph_attn_lse.shape[0] == 4 and dflash.cuda_graph_num_kv_splits.shape == (4,)
    assert dflash.cuda_graph_kv_indices.numel() == 4 * 121
    assert dflash.cuda_graph_custom_mask.numel() == 4 * 17 * 121

    other = backend(False)
    other.init_cuda_graph_state(4, 4 * 17)
    assert other.cuda_graph_attn_logits.shape[0] == 4 * 17
    assert other.cuda_graph_kv_indices.numel() == 4 * 17 * 100
    assert other.cuda_graph_custom_mask.numel() == 4 * 17 * 100
