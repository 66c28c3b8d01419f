"""Prompt building and the per-cell arithmetic, without a server."""

from __future__ import annotations

import pytest

from k26_ddtree.bench.client import GenerateRecord
from k26_ddtree.bench.metrics import percentile, server_accept_length, summarize_cell
from k26_ddtree.bench.prompts import PromptFactory, PromptSource, parse_id_range, prompt_ids
from k26_ddtree.bench.vocab import Vocabulary
from k26_ddtree.errors import UserError


VOCAB = Vocabulary(32000, frozenset(), "test")


def ids_factory(seed: int, id_range=(100, 200), vocabulary: Vocabulary = VOCAB) -> PromptFactory:
    factory = PromptFactory(PromptSource(seed=seed, id_range=id_range))
    factory.limit_to(vocabulary)
    return factory


def test_random_ids_are_exact_deterministic_and_in_range():
    factory = ids_factory(7)
    first = factory.prompts(150, 5, salt="measure")
    assert first == ids_factory(7).prompts(150, 5, salt="measure")
    assert first != factory.prompts(150, 5, salt="warmup")
    assert first != ids_factory(8).prompts(150, 5, salt="measure")
    for prompt in first:
        assert len(prompt["input_ids"]) == 150
        assert all(100 <= i < 200 for i in prompt["input_ids"])


def test_ids_stay_inside_the_vocabulary_and_skip_special_ids():
    small = Vocabulary(2048, frozenset({1, 2, *range(2000, 2048)}), "config.json of /m")
    factory = ids_factory(1, None, small)
    assert factory.describe()["id_range"] == [1000, 2000]
    ids = {i for p in factory.prompts(4096, 4, salt="m") for i in p["input_ids"]}
    assert ids == set(range(1000, 2000))
    assert set(prompt_ids((0, 10), small)) == set(range(10)) - {1, 2}
    with pytest.raises(UserError, match="--id-range 1000:30000 reaches past the served model's 2048 token ids "
                                        r"\(config.json of /m\): use HIGH <= 2048"):
        prompt_ids((1000, 30000), small)
    with pytest.raises(UserError, match="has 500 token ids .* fewer than the default --id-range 1000:30000"):
        prompt_ids(None, Vocabulary(500, frozenset(), "--vocab-size"))
    with pytest.raises(UserError, match="holds only special ids"):
        prompt_ids((1, 3), small)
    with pytest.raises(RuntimeError):
        PromptFactory(PromptSource(seed=1)).prompts(4, 1, salt="m")


def test_text_file_prompts(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("alpha beta gamma delta epsilon " * 10)
    prompts = PromptFactory(PromptSource(seed=1, text_file=text)).prompts(12, 3, salt="m")
    assert all(len(p["text"].split()) == 12 for p in prompts)
    longer = PromptFactory(PromptSource(seed=1, text_file=text)).prompts(80, 1, salt="m")
    assert len(longer[0]["text"].split()) == 80
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(UserError, match="empty"):
        PromptFactory(PromptSource(seed=1, text_file=empty))


def test_id_range_parsing():
    assert parse_id_range("5:10") == (5, 10)
    for bad in ("10:5", "x:1", "5"):
        with pytest.raises(UserError):
            parse_id_range(bad)


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_summary_arithmetic():
    records = [
        GenerateRecord(ok=True, prompt_tokens=10, completion_tokens=9, spec_verify_ct=3, latency_s=1.0, ttft_s=0.2,
                       chunk_gaps_s=[0.4, 0.4]),
        GenerateRecord(ok=True, prompt_tokens=10, completion_tokens=9, spec_verify_ct=6, latency_s=2.0, ttft_s=0.4,
                       chunk_gaps_s=[0.3] * 5),
        GenerateRecord(ok=False, error="HTTP 500: boom"),
    ]
    cell = summarize_cell(context=10, concurrency=2, output_len=9, planned=3, records=records, duration_s=3.0,
                          server_info={"internal_states": [{"avg_spec_accept_length": 2.0}, {"avg_spec_accept_length": 3.0}]})
    assert cell["accept_length"] == pytest.approx(18 / 9)
    assert cell["server_avg_spec_accept_length"] == pytest.approx(2.5)
    assert cell["output_tok_s"] == pytest.approx(6.0)
    assert cell["request_tok_s"]["mean"] == pytest.approx((9 + 4.5) / 2)
    assert cell["tpot_ms"]["mean"] == pytest.approx((0.8 / 8 + 1.6 / 8) / 2 * 1000)
    assert cell["itl_ms"]["count"] == 7
    assert (cell["errors"], cell["has_errors"], cell["error_samples"]) == (1, True, ["HTTP 500: boom"])


def test_no_spec_numbers_for_autoregressive():
    cell = summarize_cell(context=1, concurrency=1, output_len=1, planned=1,
                          records=[GenerateRecord(ok=True, completion_tokens=4, latency_s=1.0, ttft_s=0.1)],
                          duration_s=1.0, server_info={"internal_states": [{}]})
    assert cell["accept_length"] is None and cell["server_avg_spec_accept_length"] is None
    assert server_accept_length(None) is None
