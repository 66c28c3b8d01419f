"""The triton backend's CUDA-graph buffers on SGLang 0.5.17, built by the patched TritonAttnBackend's
own __init__ on a stand-in model runner: per request for DFlash runners (target and draft), per token
for other algorithms; and the static-memory reserve holds exactly what the target's verify runners
allocate, one backend per verify width under a schedule."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from v0517_support import ddtree_cli, parse

SCHEDULE = "1:32/8,8:8/4,16:0"  # widths 33, 9 and the block's 8
SIZES = ["--cuda-graph-bs-decode", "1", "2", "4", "8", "16", "32", "64"]
BLOCK = ["--speculative-dflash-block-size", "8"]
# A tiny DeepSeek-V3 (Kimi K2's architecture): MLA, whose value buffer is kv_lora_rank wide.
MLA_TARGET = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 8, "kv_lora_rank": 64, "q_lora_rank": 32, "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16, "v_head_dim": 32, "vocab_size": 1024, "max_position_embeddings": 16384,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "torch_dtype": "bfloat16",
}


class CapturingRunner:
    """Stands in for SGLang's DecodeCudaGraphRunner, which captures on a GPU: sizes its attention
    backend's graph state as that runner's __init__ does, for its largest batch size."""

    def __init__(self, model_runner, *, attn_backend=None, speculative_num_draft_tokens=None, batch_sizes=None):
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

        self.attn_backend = attn_backend or model_runner.attn_backend
        width = model_runner.decode_num_tokens_per_req(
            num_draft_tokens=speculative_num_draft_tokens or model_runner.server_args.speculative_num_draft_tokens
        )
        max_bs = max(batch_sizes or get_batch_sizes_to_capture(model_runner, width)[0])
        self.attn_backend.init_cuda_graph_state(max_bs, max_bs * width)


@pytest.fixture
def gpu_like(patched_sglang, monkeypatch):
    """The backend as on an H100: 132 SMs (an MLA model's kv splits follow them) and the GPU
    kernels' full verify-mask layout."""
    from sglang.srt.layers.attention import triton_backend, verify_mask
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    monkeypatch.setattr(triton_backend, "get_device_core_count", lambda gpu_id: 132)
    monkeypatch.setattr(verify_mask, "default_tree_mask_mode", lambda: TreeMaskMode.FULL_MASK)
    monkeypatch.setattr(decode_cuda_graph_runner, "DecodeCudaGraphRunner", CapturingRunner)


@pytest.fixture
def mla_models(models, tmp_path):
    target = tmp_path / "mla-target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(MLA_TARGET))
    return str(target), models[1]


def model_runner_of(args, is_draft_worker=False, algorithm="DFLASH"):
    """A ModelRunner with what TritonAttnBackend.__init__ and the graph runners read, its
    attention backend the real one. req_to_token rows are SGLang's: the context, 4 spare columns
    and the spec bag's count (mem_cache/kv_cache_configurator.py)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.runtime_context import get_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    get_context().set_server_args(args)
    model_config = args.get_model_config()
    value_dim = model_config.kv_lora_rank if model_config.attention_arch.name == "MLA" else model_config.v_head_dim
    runner = object.__new__(ModelRunner)
    runner.server_args = args
    runner.model_config = model_config
    runner.is_draft_worker = is_draft_worker
    runner.spec_algorithm = SpeculativeAlgorithm.from_string(algorithm)
    row = model_config.context_len + 4 + args.speculative_num_draft_tokens
    runner.req_to_token_pool = SimpleNamespace(size=64, req_to_token=torch.zeros(64, row, dtype=torch.int32))
    runner.token_to_kv_pool = SimpleNamespace(get_value_buffer=lambda layer_id: torch.zeros(1, 1, value_dim))
    runner.token_to_kv_pool_allocator = SimpleNamespace()
    runner.sliding_window_size = None
    runner.page_size = 1
    runner.device = "cpu"
    runner.gpu_id = 0
    with attention_ranks(args):
        runner.attn_backend = TritonAttnBackend(runner)
    return runner


def attention_ranks(args):
    """The attention ranks distributed start-up would set: one DP group, tensor-parallel attention."""
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().override(attn_tp_size=args.tp_size, attn_cp_size=1, attn_dcp_size=1, attn_dcp_rank=0)


def verify_backends(model_runner):
    """The attention backends of the target's verify graph runners, as the patched
    ModelRunner._decode_cuda_graph_runner_cls builds them."""
    with attention_ranks(model_runner.server_args):
        runner = model_runner._decode_cuda_graph_runner_cls()(model_runner)
    runners = getattr(runner, "runners", {None: runner})
    return {width: r.attn_backend for width, r in runners.items()}


def graph_buffer_bytes(backend) -> int:
    tensors = [backend.cuda_graph_attn_logits, backend.cuda_graph_attn_lse, backend.cuda_graph_num_kv_splits,
               backend.cuda_graph_kv_indices]
    if backend.cuda_graph_swa_attn_logits is not None:
        tensors.append(backend.cuda_graph_swa_attn_logits)
    if backend.verify_mask is not None:
        tensors.append(backend.verify_mask.buffer)
    return sum(t.numel() * t.element_size() for t in tensors)


def test_triton_graph_buffers_of_dflash_runners_are_per_request(gpu_like, models):
    """Decode-only rows and kv_indices per request (a req_to_token row each) for the DFlash target
    and draft, the target's verify mask width * (context + width) per request; another algorithm
    keeps SGLang's per-token sizes."""
    args = parse(ddtree_cli(models, "--speculative-ddtree-budget", "32", *SIZES))
    context, row = 4096, 4096 + 4 + 33

    target = model_runner_of(args).attn_backend
    target.init_cuda_graph_state(4, 4 * 33)
    assert target.cuda_graph_verify_only
    assert target.cuda_graph_attn_logits.shape[0] == target.cuda_graph_attn_lse.shape[0] == 4
    assert target.cuda_graph_num_kv_splits.shape == (4,)
    assert target.cuda_graph_kv_indices.numel() == 4 * row
    assert target.verify_mask.buffer.numel() == 4 * 33 * (context + 33)

    draft = model_runner_of(args, is_draft_worker=True).attn_backend
    draft.init_cuda_graph_state(4, 4 * 8)
    assert draft.cuda_graph_attn_logits.shape[0] == 4 and draft.cuda_graph_kv_indices.numel() == 4 * row
    assert draft.verify_mask is None, "the draft reads no verify mask"

    other = model_runner_of(args, algorithm="EAGLE").attn_backend
    other.init_cuda_graph_state(4, 4 * 33)
    assert not other.cuda_graph_verify_only
    assert other.cuda_graph_attn_logits.shape[0] == other.cuda_graph_num_kv_splits.shape[0] == 4 * 33
    assert other.cuda_graph_kv_indices.numel() == 4 * 33 * context


@pytest.mark.parametrize("flags, runners, widest", [
    ([*BLOCK, "--speculative-ddtree-budget-schedule", SCHEDULE], {33: (7, 33), 9: (15, 9), 8: (64, 8)}, 33),
    (["--speculative-ddtree-budget", "32"], {None: (64, 33)}, 33),
    (["--speculative-ddtree-budget", "4", "--speculative-ddtree-topk", "2"], {None: (64, 8)}, 5),
])
def test_the_reserve_holds_every_verify_runners_graph_buffers(gpu_like, models, flags, runners, widest):
    """Under a schedule a backend per width, its mask at its width, at its largest batch size; one
    width keeps SGLang's runner, its mask at the spec bag's count (budget 4's: the block). Beside
    them the reserve holds the verify logits of the widest width (graphs and eager)."""
    from k26_ddtree.sglang.v0_5_17.args import verify_graph_buffer_bytes, verify_reserved_mem_mb

    args = parse(ddtree_cli(models, *flags, *SIZES))
    backends = verify_backends(model_runner_of(args))
    assert {w: (b.cuda_graph_attn_logits.shape[0], b.num_draft_tokens) for w, b in backends.items()} == runners
    allocated = sum(graph_buffer_bytes(b) for b in backends.values())
    model_config = args.get_model_config()
    assert verify_graph_buffer_bytes(args, model_config) == allocated

    logits = (64 + 4 * args.max_running_requests) * widest * 4 * model_config.vocab_size
    assert verify_reserved_mem_mb(args) == (logits + allocated) / (1 << 20)


def test_the_reserve_holds_an_mla_models_decode_rows_at_its_kv_splits(gpu_like, mla_models):
    """An MLA model's kv splits follow the SM count (256 for an H100's 132 SMs at this context) and
    its decode rows are kv_lora_rank wide; at TP 2 each rank holds half the heads."""
    from k26_ddtree.sglang.v0_5_17.args import verify_graph_buffer_bytes

    args = parse(ddtree_cli(mla_models, *BLOCK, "--speculative-ddtree-budget-schedule", SCHEDULE, *SIZES,
                            "--tp-size", "2"))
    backends = verify_backends(model_runner_of(args))
    assert {(b.num_head, b.max_kv_splits, b.v_head_dim) for b in backends.values()} == {(4, 256, 64)}
    allocated = sum(graph_buffer_bytes(b) for b in backends.values())
    assert verify_graph_buffer_bytes(args, args.get_model_config()) == allocated


def test_the_reserve_counts_no_graph_buffers_without_graphs(patched_sglang, models):
    from k26_ddtree.sglang.v0_5_17.args import verify_graph_buffer_bytes

    args = parse(ddtree_cli(models, "--speculative-ddtree-budget", "32", "--disable-cuda-graph"))
    assert verify_graph_buffer_bytes(args, args.get_model_config()) == 0

