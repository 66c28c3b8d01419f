"""Corpus determinism, the locally built tokenizer, and the tiny model pair's configs and weights."""

import json
import shutil

import pytest
import torch

from proving_ground import corpus, tinymodel, tokenizer, train
from k26_ddtree.errors import UserError

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def text_root(pristine_sglang):
    return pristine_sglang / "sglang"


@pytest.fixture(scope="module")
def lines(text_root):
    return corpus.corpus_lines(text_root, 60_000)


def test_the_text_is_the_pinned_sources_without_their_license_headers(text_root, lines):
    assert corpus.corpus_lines(text_root, 60_000) == lines, "a pure function of the package folder"
    assert 40_000 < sum(map(len, lines)) <= 60_000 and all(line.strip() for line in lines)
    assert not any("Licensed under the Apache License" in line for line in lines)
    first = corpus.source_files(text_root)[0]
    assert first.relative_to(text_root).parts[:2] == tuple(corpus.SUBPACKAGES[0].split("/"))
    assert corpus.fingerprint(lines) != corpus.fingerprint(lines[1:])


def test_the_full_text_leaves_every_prompt_a_continuation_that_never_cycles_in_the_source(text_root):
    """What a target that reproduces the text continues with: none of it periodic under 64."""
    full = corpus.corpus_lines(text_root)
    ids = train.encode_corpus(tokenizer.build_tokenizer(full, tinymodel.VOCAB), full).tolist()
    offsets = corpus.prompt_offsets(len(ids))
    assert len(offsets) == corpus.PROMPTS
    # Served prompts' continuations do not overlap one another.
    assert min(b - a for a, b in zip(offsets, offsets[1:])) >= corpus.PROMPT_TOKENS + corpus.CONTINUATION_TOKENS
    starts = [o + corpus.PROMPT_TOKENS for o in offsets]
    periods = [corpus.shortest_period(ids[s:s + corpus.CONTINUATION_TOKENS]) for s in starts]
    assert min(periods) >= corpus.MIN_PERIOD, periods


def test_shortest_period():
    assert corpus.shortest_period([1, 2, 3, 1, 2, 3, 1]) == 3
    assert corpus.shortest_period([5] * 10) == 1
    assert corpus.shortest_period([1, 2, 3, 4]) == 4
    assert corpus.shortest_period(list(range(64)) * 4) == 64


def test_prompt_offsets_refuse_a_text_too_short():
    with pytest.raises(ValueError, match="too few"):
        corpus.prompt_offsets(300)


def test_a_missing_text_root_is_one_line(tmp_path, capsys):
    assert train.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--smoke", "--text-root",
                       str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train: error: ") and "holds Python source" in err and len(err.splitlines()) == 1


@pytest.fixture(scope="module")
def tok(lines):
    return tokenizer.build_tokenizer(lines, tinymodel.VOCAB)


def test_tokenizer_vocab_is_exactly_the_models(tok, lines):
    assert tok.get_vocab_size() == tinymodel.VOCAB == tinymodel.TARGET_CONFIG["vocab_size"]
    assert [tok.id_to_token(i) for i in range(3)] == ["<|bos|>", "<|eos|>", "<|MASK|>"]
    assert tinymodel.DRAFT_CONFIG["dflash_config"]["mask_token_id"] == tok.token_to_id("<|MASK|>")
    text = "\n".join(lines[:5])
    assert tok.decode(tok.encode(text).ids) == text


def test_tokenizer_build_is_deterministic(tok, lines):
    again = tokenizer.build_tokenizer(lines, tinymodel.VOCAB)
    assert again.to_str() == tok.to_str()


def test_saved_tokenizer_loads_in_transformers(tok, tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizer.save_tokenizer(tok, tmp_path, 4096)
    loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(loaded) == tinymodel.VOCAB
    assert loaded.convert_ids_to_tokens([2]) == ["<|MASK|>"]


def test_drafter_config_matches_sglang_dflash_expectations():
    c = tinymodel.DRAFT_CONFIG
    dflash = c["dflash_config"]
    assert c["architectures"] == ["DFlashDraftModel"] and dflash["block_size"] == 8
    assert c["hidden_size"] == tinymodel.TARGET_CONFIG["hidden_size"]  # shares the target's embeddings and lm_head
    # deepseek_v2 captures layer i's output at the input of layer i+1, so i+1 must be a layer.
    assert max(dflash["target_layer_ids"]) + 1 < tinymodel.TARGET_CONFIG["num_hidden_layers"]
    assert c["num_attention_heads"] % c["num_key_value_heads"] == 0


def test_checkpoints_use_sglang_loader_names_and_dtypes(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    target = tinymodel.TinyDeepseekV3()
    tinymodel.init_weights(target, 0)
    tinymodel.save_checkpoint(target, tinymodel.TARGET_CONFIG, tmp_path / "target")
    weights = safetensors.load_file(str(tmp_path / "target" / "model.safetensors"))
    assert "model.layers.0.mlp.gate_proj.weight" in weights  # the dense first layer
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in weights
    assert "model.layers.2.mlp.shared_experts.up_proj.weight" in weights
    assert "model.layers.1.self_attn.kv_a_proj_with_mqa.weight" in weights
    bias = weights["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert bias.dtype == torch.float32 and bias.abs().sum() > 0
    assert weights["lm_head.weight"].dtype == torch.bfloat16
    assert json.loads((tmp_path / "target" / "config.json").read_text())["topk_method"] == "noaux_tc"

    drafter = tinymodel.TinyDFlashDrafter()
    tinymodel.save_checkpoint(drafter, tinymodel.DRAFT_CONFIG, tmp_path / "drafter")
    names = set(safetensors.load_file(str(tmp_path / "drafter" / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_norm.weight",
            "layers.0.mlp.gate_proj.weight", "layers.0.self_attn.k_proj.weight"} <= names
    assert not any("embed" in n or "lm_head" in n for n in names)


def test_target_math_equals_transformers_deepseek_v3():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.DeepseekV3Config(**{k: v for k, v in tinymodel.TARGET_CONFIG.items() if k != "architectures"})
    cfg._attn_implementation = "eager"
    hf = transformers.DeepseekV3ForCausalLM(cfg).float().eval()
    mine = tinymodel.TinyDeepseekV3().eval()
    tinymodel.init_weights(mine, 0)
    state = {k: v for k, v in mine.state_dict().items() if ".mlp.experts." not in k}
    experts = tinymodel.TARGET_CONFIG["n_routed_experts"]
    for layer in range(1, tinymodel.TARGET_CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp.experts"
        sd = mine.state_dict()
        state[f"{p}.gate_up_proj"] = torch.stack(
            [torch.cat([sd[f"{p}.{e}.gate_proj.weight"], sd[f"{p}.{e}.up_proj.weight"]]) for e in range(experts)])
        state[f"{p}.down_proj"] = torch.stack([sd[f"{p}.{e}.down_proj.weight"] for e in range(experts)])
    hf.load_state_dict(state, strict=True)
    ids = torch.randint(3, tinymodel.VOCAB, (2, 24))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, mine(ids)[0], atol=1e-4)


def test_drafter_training_batch_shapes_and_mask():
    target = tinymodel.TinyDeepseekV3()
    drafter = tinymodel.TinyDFlashDrafter()
    windows = torch.randint(3, tinymodel.VOCAB, (2, 40))
    logits, labels = train.draft_batch(target, drafter, windows)
    roots = 40 - tinymodel.BLOCK_SIZE  # every root from 1 whose block fits in the window
    assert logits.shape == (2, roots, tinymodel.BLOCK_SIZE - 1, tinymodel.VOCAB)
    assert labels.shape == (2, roots, tinymodel.BLOCK_SIZE - 1)
    # block r's labels are the window's tokens after its root, r + 1 .. r + BLOCK_SIZE - 1
    assert labels[1, 0].tolist() == windows[1, 2:1 + tinymodel.BLOCK_SIZE].tolist()
    assert labels[0, -1].tolist() == windows[0, roots + 1:roots + tinymodel.BLOCK_SIZE].tolist()


@pytest.fixture(scope="module")
def smoke_pair(tmp_path_factory, text_root):
    out = tmp_path_factory.mktemp("pair")
    train.make_pair(out, 0, time_budget=600.0, device=torch.device("cpu"), text_root=text_root, knobs=train.SMOKE)
    return out


def test_smoke_training_writes_the_pair_its_prompts_and_their_acceptance(smoke_pair):
    tmp_path = smoke_pair
    for sub in ("target", "drafter", "drafter-weak", "drafter-weaker", "drafter-mid"):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (tmp_path / sub / name).is_file()
    weak = json.loads((tmp_path / "drafter-weak" / "config.json").read_text())
    assert weak == tinymodel.DRAFT_CONFIG, "a goal drafter is the drafter's weights where it reached its goal"
    meta = json.loads((tmp_path / "prompts.json").read_text())
    prompts = meta["prompts"]
    assert len(prompts) == train.SMOKE.prompts and meta["served"] == train.SMOKE.served
    assert all(len(p["input_ids"]) == corpus.PROMPT_TOKENS for p in prompts)
    report = json.loads((tmp_path / "train_report.json").read_text())
    continuations = report["target"]["continuations"]
    assert {"median_gap", "p10_gap", "min_gap", "shortest_period_min", "share_equal_to_text_mean"} <= set(continuations)
    assert len(continuations["periods"]) == train.SMOKE.prompts
    assert report["text"]["fingerprint"] == meta["text"]["fingerprint"]
    assert report["drafter_weak"]["goal"] == train.WEAK_GOAL and report["drafter_mid"]["goal"] == train.MID_GOAL
    assert report["drafter_weaker"]["goal"] == train.WEAKER_GOAL < train.WEAK_BAND[0]
    table = json.loads((tmp_path / "acceptance.json").read_text())
    for kind in ("real", "weak", "weaker", "mid"):
        assert set(table[kind]["acceptance_every_start"]) == set(table[kind]["acceptance"])
        acceptance = table[kind]["acceptance"]
        assert set(acceptance) == {shape.name for shape in train.TREE_SHAPES}
        assert all(1.0 <= a <= tinymodel.BLOCK_SIZE for a in acceptance.values())
        # the spine keeps the chain inside the tree: never fewer tokens than linear DFlash
        assert acceptance["b64k8-spine"] >= acceptance["b7k1"] - 1e-9
        assert set(table[kind]["rank_histogram"]) == {str(d) for d in range(1, tinymodel.BLOCK_SIZE)}


def test_the_report_names_the_pair_by_the_digest_of_its_weights_tokenizer_and_prompts(smoke_pair, tmp_path):
    report = json.loads((smoke_pair / "train_report.json").read_text())
    assert report["pair_sha256"] == train.pair_digest(smoke_pair)
    assert report["reproducible"] == (not report["cut_by_time_budget"])
    copy = tmp_path / "pair"
    shutil.copytree(smoke_pair, copy)
    (copy / "train_report.json").write_text("{}")  # timings vary between runs: not part of the pair
    assert train.pair_digest(copy) == report["pair_sha256"]
    weights = copy / "drafter-weak" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    assert train.pair_digest(copy) != report["pair_sha256"]


def test_the_same_recipe_makes_the_same_pair_and_the_check_says_so(text_root, tmp_path, capsys):
    assert train.main(["--out", str(tmp_path), "--check-determinism", "--device", "cpu", "--smoke",
                       "--text-root", str(text_root)]) == 0
    assert "bit-identical" in capsys.readouterr().out
    first, second = (json.loads((tmp_path / n / "train_report.json").read_text()) for n in ("first", "second"))
    assert first["pair_sha256"] == second["pair_sha256"] == train.pair_digest(tmp_path / "second")
    assert first["reproducible"] and first["target"]["stopped_by"] in ("goal", "steps")


def test_a_training_the_time_budget_cuts_is_reported_not_reproducible(text_root, tmp_path):
    report = train.make_pair(tmp_path, 0, time_budget=0.0, device=torch.device("cpu"), text_root=text_root,
                             knobs=train.SMOKE)
    assert report["target"] == dict(report["target"], steps=0, stopped_by="time budget")
    assert not report["reproducible"] and "target" in report["cut_by_time_budget"]
    assert json.loads((tmp_path / "train_report.json").read_text())["reproducible"] is False


def test_add_drafter_trains_one_goal_drafter_against_the_target_already_there(smoke_pair, text_root, tmp_path,
                                                                             capsys, monkeypatch):
    # A goal past the block of 8 is never reached, whatever the smoke target's continuations: on
    # some torch builds they are easy enough that a few smoke steps reach the mid goal.
    unreachable = train.GoalDrafter(9.0)
    monkeypatch.setitem(train.GOAL_DRAFTERS, "mid", unreachable)
    tmp_path = tmp_path / "pair"
    shutil.copytree(smoke_pair, tmp_path)
    target_before = (tmp_path / "target" / "model.safetensors").read_bytes()
    mid_before = (tmp_path / "drafter-mid" / "model.safetensors").read_bytes()
    args = ["--out", str(tmp_path), "--add-drafter", "mid", "--device", "cpu", "--smoke", "--time-budget", "600",
            "--text-root", str(text_root)]
    # Earlier results were measured with the drafter there: kept unless --replace.
    assert train.main(args) == 2
    assert "drafter-mid exists" in capsys.readouterr().err
    assert (tmp_path / "drafter-mid" / "model.safetensors").read_bytes() == mid_before
    table = json.loads((tmp_path / "acceptance.json").read_text())
    del table["mid"]
    (tmp_path / "acceptance.json").write_text(json.dumps(table))
    assert train.main([*args, "--replace"]) == 0
    mid = json.loads((tmp_path / "drafter-mid" / "config.json").read_text())
    assert mid == tinymodel.DRAFT_CONFIG
    tokenizer_json = (tmp_path / "target" / "tokenizer.json").read_bytes()
    assert (tmp_path / "drafter-mid" / "tokenizer.json").read_bytes() == tokenizer_json
    assert (tmp_path / "target" / "model.safetensors").read_bytes() == target_before
    table = json.loads((tmp_path / "acceptance.json").read_text())
    assert {"real", "weak", "mid"} <= set(table)
    assert set(table["mid"]["acceptance"]) == {shape.name for shape in train.TREE_SHAPES}
    report = json.loads((tmp_path / "train_report.json").read_text())
    mid_report = report["drafter_mid"]
    assert mid_report["goal"] == unreachable.goal and mid_report["device"] == "cpu"
    # A goal not reached is said in the report and the log, and the drafter is still saved.
    assert mid_report["reached_goal"] is False and mid_report["step"] is None
    assert "never reached the mid drafter's goal" in capsys.readouterr().out
    assert report["drafter_weak"]["in_band"] is False and "band" not in mid_report
    assert not list(tmp_path.glob("*.tmp"))


def _widened(folder):
    config = json.loads((folder / "target" / "config.json").read_text())
    (folder / "target" / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=48)))


@pytest.mark.parametrize("spoil, said", [
    (lambda f: shutil.rmtree(f / "target"), "not a model folder"),
    (_widened, "(a widened one?)"),
    (lambda f: (f / "prompts.json").write_text(json.dumps({"seed": 0, "served": 1, "text": {"fingerprint": "x"},
                                                           "prompts": []})),
     "prompts.json: expected"),
    (lambda f: (f / "prompts.json").write_text(json.dumps({"seed": 0, "served": 1, "text": {"fingerprint": "x"},
                                                           "prompts": [{"input_ids": [5, 99999], "text_offset": 0}]})),
     "token ids in 0..2047"),
    (lambda f: (f / "prompts.json").write_text(json.dumps({"seed": 0, "prompts": [{"input_ids": [5]}]})),
     "not a model folder"),
    (lambda f: (f / "train_report.json").write_text("[]"), "train_report.json: not a JSON object"),
    (lambda f: (f / "acceptance.json").write_text('{"real": '), "not a model folder"),
    (lambda f: (f / "target" / "tokenizer.json").write_text("{"), "tokenizer.json"),
    (lambda f: shutil.copyfile(f / "drafter" / "model.safetensors", f / "target" / "model.safetensors"),
     "not the tiny target's weights"),
])
def test_add_drafter_refuses_a_folder_it_cannot_use_before_training(smoke_pair, text_root, tmp_path, capsys, spoil,
                                                                    said):
    folder = tmp_path / "pair"
    shutil.copytree(smoke_pair, folder)
    spoil(folder)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert train.main(["--out", str(folder), "--add-drafter", "mid", "--device", "cpu", "--replace",
                       "--text-root", str(text_root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train: error: ") and said in err and len(err.splitlines()) == 1, err
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_redraft_trains_every_drafter_anew_on_the_targets_own_continuations(smoke_pair, text_root, tmp_path):
    folder = tmp_path / "pair"
    shutil.copytree(smoke_pair, folder)
    target = (folder / "target" / "model.safetensors").read_bytes()
    prompts = (folder / "prompts.json").read_bytes()
    assert train.main(["--out", str(folder), "--redraft", "--device", "cpu", "--smoke", "--time-budget", "600",
                       "--text-root", str(text_root)]) == 0
    assert (folder / "target" / "model.safetensors").read_bytes() == target
    assert (folder / "prompts.json").read_bytes() == prompts
    report = json.loads((folder / "train_report.json").read_text())
    assert report["drafter"]["distilled"] == [train.SMOKE.distill, corpus.PROMPT_TOKENS + train.SMOKE.report_new_tokens]
    assert {f"drafter_{name}" for name in train.GOAL_DRAFTERS} <= set(report) and "target" in report
    assert set(json.loads((folder / "acceptance.json").read_text())) >= {"real", "weak", "weaker", "mid"}


def test_distilled_sequences_are_the_targets_continuations_of_text_windows():
    data = torch.arange(3, 1003) % tinymodel.VOCAB
    knobs = train.SMOKE
    # Initialised as training does, so the continuations are a seeded model's, not a zero gate's.
    target = tinymodel.TinyDeepseekV3()
    tinymodel.init_weights(target, 0)
    tinymodel.out_proj_scale(target, tinymodel.TARGET_CONFIG["num_hidden_layers"])
    target.eval()
    seqs = train.distill_set(target, data, 0, knobs, torch.device("cpu"))
    assert seqs.shape == (knobs.distill, corpus.PROMPT_TOKENS + knobs.report_new_tokens)
    for row in seqs.tolist():
        start = row[0] - 3  # the text is arange: its first token says where it started
        assert row[:corpus.PROMPT_TOKENS] == data[start:start + corpus.PROMPT_TOKENS].tolist()
    # Greedy, checked by one teacher-forced pass: every continuation token is its prefix's top-1.
    # An untrained model's logits hold near-ties, and the decode runs in bf16: a pass of another
    # shape can round a near-tie the other way. So a token within the lossless rule's tie margin
    # (0.05 nats) of the top-1 counts, as that rule counts a tie.
    with torch.no_grad(), train.amp(torch.device("cpu")):
        logits, _ = target(seqs)
    logprobs = logits.float().log_softmax(-1)[:, corpus.PROMPT_TOKENS - 1:-1]
    chosen = logprobs.gather(-1, seqs[:, corpus.PROMPT_TOKENS:, None])[..., 0]
    below_top1 = logprobs.max(-1).values - chosen
    assert below_top1.max().item() <= 0.05
    assert (below_top1 == 0).float().mean().item() > 0.9


def test_distilling_a_text_shorter_than_a_prompt_is_refused():
    with pytest.raises(UserError, match="too few"):
        train.distill_set(tinymodel.TinyDeepseekV3().eval(), torch.arange(3, 20), 0, train.SMOKE,
                          torch.device("cpu"))