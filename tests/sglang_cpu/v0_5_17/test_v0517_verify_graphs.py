"""A schedule's verify widths on SGLang 0.5.17: one target verify graph runner per width behind the
patched ModelRunner._decode_cuda_graph_runner_cls, each runner's width through SGLang's own
derivation point, the triton backend's eager plan at a step's own width, and the verify reserve in
ServerArgs' static-memory estimate."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from v0517_support import cli, ddtree_cli, parse

SCHEDULE = "1:32/8,8:8/4,16:0"  # widths 33, 9 and the block's 8
SIZES = ["--cuda-graph-bs-decode", "1", "2", "4", "8", "16", "32", "64"]


class FakeRunner:
    """Stands in for SGLang's DecodeCudaGraphRunner, which captures on a GPU; records how it was built."""

    def __init__(self, model_runner, *, attn_backend=None, speculative_num_draft_tokens=None, batch_sizes=None):
        self.attn_backend = attn_backend or model_runner.attn_backend
        self.width = model_runner.decode_num_tokens_per_req(num_draft_tokens=speculative_num_draft_tokens)
        self.mask_width = self.attn_backend.num_draft_tokens
        self.batch_sizes = batch_sizes
        self.calls = []
        self.bs = None

    def can_run_graph(self, forward_batch):
        return forward_batch.batch_size <= self.batch_sizes[-1]

    def load_batch(self, forward_batch, pp_proxy_tensors=None):
        self.bs = next(b for b in self.batch_sizes if b >= forward_batch.batch_size)
        self.calls.append(("load", forward_batch.batch_size))

    def execute(self, forward_batch, pp_proxy_tensors=None):
        self.calls.append(("execute", forward_batch.batch_size))
        return "logits"


def model_runner_of(args, monkeypatch, is_draft_worker=False):
    """A ModelRunner with what the hook reads, its width method SGLang's own."""
    from sglang.srt.layers.attention import triton_backend
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    class Backend(triton_backend.TritonAttnBackend):
        def __init__(self, model_runner):
            self.num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens

    monkeypatch.setattr(triton_backend, "TritonAttnBackend", Backend)
    monkeypatch.setattr(decode_cuda_graph_runner, "DecodeCudaGraphRunner", FakeRunner)
    runner = object.__new__(ModelRunner)
    runner.server_args = args
    runner.is_draft_worker = is_draft_worker
    runner.spec_algorithm = SpeculativeAlgorithm.DFLASH
    runner.req_to_token_pool = SimpleNamespace(size=64)
    runner.attn_backend = Backend(runner)
    return runner


def build_runner(model_runner):
    """As cuda_graph_setup.capture_decode_graph builds the decode graph runner, with the server's
    args published and one attention rank (SGLang's capture sizes read both; distributed start-up,
    which this test does not run, sets the ranks)."""
    from sglang.srt.runtime_context import get_context, get_parallel

    get_context().set_server_args(model_runner.server_args)
    with get_parallel().override(attn_tp_size=1, attn_cp_size=1):
        return model_runner._decode_cuda_graph_runner_cls()(model_runner)


def verify_batch(bs, width):
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    return SimpleNamespace(batch_size=bs, spec_info=DFlashVerifyInput(draft_token=None, positions=None,
                                                                      draft_token_num=width))


def test_the_target_gets_a_runner_per_width_with_its_buckets_sizes_and_backend(patched_sglang, models, monkeypatch):
    args = parse(ddtree_cli(models, "--speculative-dflash-block-size", "8", "--speculative-ddtree-budget-schedule",
                            SCHEDULE, *SIZES))
    model_runner = model_runner_of(args, monkeypatch)
    runner = build_runner(model_runner)
    assert {w: r.batch_sizes for w, r in runner.runners.items()} == {33: [1, 2, 4, 7], 9: [8, 15], 8: [16, 32, 64]}
    assert all(r.width == r.mask_width == w for w, r in runner.runners.items()), "graphs and mask at the width"
    backends = {id(r.attn_backend) for r in runner.runners.values()}
    assert len(backends) == 3 and id(model_runner.attn_backend) not in backends


def test_a_verify_runs_on_its_widths_runner_and_past_its_sizes_eagerly(patched_sglang, models, monkeypatch):
    args = parse(ddtree_cli(models, "--speculative-dflash-block-size", "8", "--speculative-ddtree-budget-schedule",
                            SCHEDULE, *SIZES))
    runner = build_runner(model_runner_of(args, monkeypatch))
    assert runner.can_run_graph(verify_batch(5, 33)) and runner.can_run_graph(verify_batch(12, 9))
    assert runner.can_run_graph(verify_batch(64, 8))
    assert not runner.can_run_graph(verify_batch(70, 8)), "past the largest captured size: eager"
    assert not runner.can_run_graph(verify_batch(5, 17)), "a width no runner holds: eager"

    # dflash_info.prepare_for_verify plans, then ModelRunner.forward replays the same width's graph.
    batch = verify_batch(12, 9)
    runner.load_batch(batch)
    assert runner.execute(batch) == "logits" and runner.bs == 15
    assert runner.runners[9].calls == [("load", 12), ("execute", 12)]
    assert runner.runners[33].calls == runner.runners[8].calls == []


@pytest.mark.parametrize("flags", [
    ["--speculative-ddtree-budget", "16"],
    ["--speculative-dflash-block-size", "8", "--speculative-ddtree-budget-schedule", "1:7/2,8:0"],
])
def test_one_width_and_the_draft_keep_sglangs_runner(patched_sglang, models, monkeypatch, flags):
    args = parse(ddtree_cli(models, *flags, *SIZES))
    assert isinstance(build_runner(model_runner_of(args, monkeypatch)), FakeRunner)
    scheduled = parse(ddtree_cli(models, "--speculative-dflash-block-size", "8",
                                 "--speculative-ddtree-budget-schedule", SCHEDULE, *SIZES))
    draft = build_runner(model_runner_of(scheduled, monkeypatch, is_draft_worker=True))
    assert isinstance(draft, FakeRunner) and draft.width == 8


def test_breakable_decode_graphs_are_refused_for_several_widths(patched_sglang, models, monkeypatch):
    args = parse(ddtree_cli(models, "--speculative-dflash-block-size", "8", "--speculative-ddtree-budget-schedule",
                            SCHEDULE, *SIZES))
    args.cuda_graph_config.decode.backend = "breakable"
    with pytest.raises(RuntimeError, match="full decode CUDA graphs"):
        build_runner(model_runner_of(args, monkeypatch))


def test_widths_per_bucket_through_sglangs_derivation_point(patched_sglang, models):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req

    args = parse(ddtree_cli(models, "--speculative-dflash-block-size", "8", "--speculative-ddtree-budget-schedule",
                            SCHEDULE))

    def width(asked, draft=False):
        return resolve_num_tokens_per_req(phase="target_verify", server_args=args,
                                          spec_algorithm=SpeculativeAlgorithm.DFLASH, is_draft_worker=draft,
                                          num_draft_tokens=asked)

    assert [width(w) for w in (33, 9, 8)] == [33, 9, 8], "a width's own runner"
    assert width(None) == width(17) == 33, "the spec bag's count and any other: the widest (the logits buffer)"
    assert width(9, draft=True) == 8


def test_eager_verify_plans_the_triton_metadata_for_the_steps_own_width(patched_sglang):
    """SGLang's eager TARGET_VERIFY plan (TritonAttnBackend.init_forward_metadata) reads the width of
    the verify input, not the backend's (the widest): a b8 bucket's step plans 9 tokens per request."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs, seq_lens = 2, torch.tensor([5, 7])
    backend = SimpleNamespace(
        num_draft_tokens=33, window_kv_indptr=None, sliding_window_size=None, device="cpu", max_context_len=64,
        mask_indptr=torch.zeros(4, dtype=torch.int64), use_sliding_window_kv_pool=False, _translate_kv_loc=None,
        _fill_kv_indptr_and_indices=lambda bs, lens, pool, out: torch.cat([torch.zeros(1), lens.cumsum(0)]),
    )
    spec = verify_batch(bs, 9).spec_info
    spec.custom_mask = torch.ones(1, dtype=torch.bool)
    forward_batch = SimpleNamespace(batch_size=bs, spec_info=spec, forward_mode=ForwardMode.TARGET_VERIFY,
                                    req_pool_indices=torch.arange(bs), seq_lens=seq_lens, seq_lens_sum=12,
                                    out_cache_loc=None)
    TritonAttnBackend.init_forward_metadata(backend, forward_batch)
    meta = backend.forward_metadata
    assert meta.qo_indptr.tolist() == [0, 9, 18] and meta.max_extend_len == 9
    assert meta.mask_indptr.tolist() == [0, 9 * (5 + 9), 9 * (5 + 9) + 9 * (7 + 9)]


def test_the_static_memory_estimate_reserves_the_widest_verify(patched_sglang, models):
    """The widest width's logits, and every verify runner's triton graph buffers
    (test_v0517_triton_buffers holds them to what the runners allocate)."""
    from k26_ddtree.sglang.v0_5_17.args import verify_graph_buffer_bytes, verify_reserved_mem_mb

    common = ["--speculative-dflash-block-size", "8", "--cuda-graph-max-bs", "16", "--max-running-requests", "16"]
    scheduled = parse(ddtree_cli(models, *common, "--speculative-ddtree-budget-schedule", SCHEDULE))
    one = parse(ddtree_cli(models, *common, "--speculative-ddtree-budget", "32", "--speculative-ddtree-topk", "8"))
    narrow = parse(ddtree_cli(models, *common, "--speculative-ddtree-budget", "8", "--speculative-ddtree-topk", "4"))
    assert verify_reserved_mem_mb(one) > verify_reserved_mem_mb(narrow) > 0
    scheduled_graphs, one_graphs = (verify_graph_buffer_bytes(a, a.get_model_config()) for a in (scheduled, one))
    assert verify_reserved_mem_mb(scheduled) - verify_reserved_mem_mb(one) == pytest.approx(
        (scheduled_graphs - one_graphs) / (1 << 20)), "the same widest logits"

    eager = parse(ddtree_cli(models, *common, "--speculative-ddtree-budget", "32", "--disable-cuda-graph"))
    assert 0 < verify_reserved_mem_mb(eager) < verify_reserved_mem_mb(one), "no graph buffers without graphs"
    plain = parse(cli(models, *common, "--speculative-algorithm", "DFLASH", "--attention-backend", "triton"))
    assert verify_reserved_mem_mb(plain) == 0.0
