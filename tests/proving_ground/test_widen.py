"""The widened target (proving_ground.widen): the widened checkpoint computes the trained
target's logits (exactly up to summation order without jitter, within the jitter with it) while
its routing spreads over every copy of the experts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from proving_ground import tinymodel, widen

SMALL = dict(tinymodel.TARGET_CONFIG, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
             q_lora_rank=32, kv_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, vocab_size=300)


def trained_pair(tmp_path):
    model = tinymodel.TinyDeepseekV3(SMALL)
    tinymodel.init_weights(model, 3)
    models = tmp_path / "models"
    tinymodel.save_checkpoint(model, SMALL, models / "target")
    (models / "drafter").mkdir()
    (models / "prompts.json").write_text("{}")
    return models


def logits_of(folder, ids):
    config = json.loads((folder / "config.json").read_text())
    model = tinymodel.TinyDeepseekV3(config)
    model.load_state_dict({k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()})
    with torch.no_grad():
        return model(ids)[0], model


def test_widened_target_computes_the_same_logits_and_feeds_the_drafter_the_same_context(tmp_path):
    models = trained_pair(tmp_path)
    ids = torch.randint(3, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    report = widen.write_model(models, tmp_path / "wide", extra_layers=2, copies=4, topk_group=2,
                               moe_intermediate=48, jitter=0.0, device="cpu")
    assert (report["layers"], report["experts"], report["experts_per_token"]) == (5, 32, 4)
    original, _ = logits_of(models / "target", ids)
    wide, model = logits_of(tmp_path / "wide" / "target", ids)
    assert torch.allclose(wide, original, atol=1e-4, rtol=1e-4)
    assert torch.equal(wide.argmax(-1), original.argmax(-1))
    assert (tmp_path / "wide" / "drafter").resolve() == (models / "drafter").resolve()
    assert json.loads((tmp_path / "wide" / "target" / "config.json").read_text())["n_group"] == 4


def test_jitter_spreads_routing_over_every_copy_and_keeps_the_text(tmp_path):
    models = trained_pair(tmp_path)
    ids = torch.randint(3, 300, (4, 32), generator=torch.Generator().manual_seed(1))
    widen.write_model(models, tmp_path / "wide", extra_layers=1, copies=4, topk_group=2, moe_intermediate=32,
                      jitter=0.01, device="cpu")
    original, _ = logits_of(models / "target", ids)
    wide, model = logits_of(tmp_path / "wide" / "target", ids)
    assert (wide.argmax(-1) == original.argmax(-1)).float().mean() > 0.95
    moe = model.model.layers[1].mlp
    x = torch.randn(128, 64, generator=torch.Generator().manual_seed(2))
    scores = torch.nn.functional.linear(x, moe.gate.weight).sigmoid() + moe.gate.e_score_correction_bias
    chosen = tinymodel.group_limited(scores, moe.n_group, moe.topk_group).topk(moe.top_k, dim=-1).indices
    assert len(chosen.unique()) == 32, "every copy of every expert is reached by some token"


def test_bad_settings_are_one_line_errors(tmp_path):
    models = trained_pair(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "proving_ground.widen", "--models", str(models), "--out",
                           str(tmp_path / "w"), "--copies", "4", "--topk-group", "5", "--device", "cpu"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip() == "widen: error: --topk-group must be 1..--copies (4), got 5"


def _widen_cli(models, out, *extra):
    return subprocess.run([sys.executable, "-m", "proving_ground.widen", "--models", str(models), "--out", str(out),
                           "--copies", "2", "--topk-group", "1", "--extra-layers", "0", "--moe-intermediate", "32",
                           "--device", "cpu", *extra], capture_output=True, text=True)


def _one_line(proc, expected):
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("widen: error: ") and expected in proc.stderr, proc.stderr


def test_out_as_the_models_folder_or_a_file_is_refused_and_the_trained_target_kept(tmp_path):
    models = trained_pair(tmp_path)
    before = (models / "target" / "model.safetensors").read_bytes()
    _one_line(_widen_cli(models, models), "is the --models folder")
    assert (models / "target" / "model.safetensors").read_bytes() == before
    (tmp_path / "file").write_text("")
    _one_line(_widen_cli(models, tmp_path / "file"), "cannot write")
    _one_line(_widen_cli(models, tmp_path / "file" / "w"), "cannot write")
    _one_line(_widen_cli(models, tmp_path / "w", "--jitter", "nan"), "--jitter must be a finite number >= 0")


@pytest.mark.parametrize(
    "config, weights, expected",
    [
        ("[1]", None, "config.json is not an object"),
        ('{"n_group": 1}', None, "(no 'moe_intermediate_size')"),
        ("[" * 100000, None, "config.json nests deeper than the JSON reader goes"),
        (None, b"not safetensors", "not a tiny target checkpoint"),
    ],
)
def test_a_broken_target_is_one_line(tmp_path, config, weights, expected):
    models = trained_pair(tmp_path)
    if config is not None:
        (models / "target" / "config.json").write_text(config)
    if weights is not None:
        (models / "target" / "model.safetensors").write_bytes(weights)
    _one_line(_widen_cli(models, tmp_path / "w"), expected)
    assert not (tmp_path / "w").exists(), "nothing written for a target that cannot be widened"
