"""The exact model the lossless rule asks: the trained target's weights in fp32."""

import json

import pytest
import torch

from k26_ddtree.errors import UserError
from proving_ground import tinymodel
from proving_ground.exact import exact_margin

pytest.importorskip("safetensors")


@pytest.fixture
def models(tmp_path):
    target = tinymodel.TinyDeepseekV3()
    tinymodel.init_weights(target, 3)
    tinymodel.save_checkpoint(target, tinymodel.TARGET_CONFIG, tmp_path / "target")
    return tmp_path


def test_the_margin_is_the_fp32_logit_difference_of_the_saved_weights(models):
    prompts = [[5, 6, 7], [9, 10]]
    margin = exact_margin(models, prompts)
    from safetensors.torch import load_file

    target = tinymodel.TinyDeepseekV3()
    target.load_state_dict({k: v.float() for k, v in load_file(str(models / "target" / "model.safetensors")).items()})
    with torch.no_grad():
        logits, _ = target(torch.tensor([[9, 10, 11, 12]]))
    assert margin(1, [11, 12], 40, 41) == pytest.approx(float(logits[0, -1, 40] - logits[0, -1, 41]), abs=1e-5)
    assert margin(1, [11, 12], 41, 40) == pytest.approx(-margin(1, [11, 12], 40, 41))


def test_an_emulated_folder_has_the_exact_model_and_a_widened_one_has_none(models):
    config = json.loads((models / "target" / "config.json").read_text())
    emulated = dict(config, architectures=["K26EmulatedDeepseekV3ForCausalLM", "DeepseekV3ForCausalLM"],
                    k26_emulator={"box": "pcie-ep8"})
    (models / "target" / "config.json").write_text(json.dumps(emulated))
    assert exact_margin(models, [[5]]) is not None
    (models / "target" / "config.json").write_text(json.dumps(dict(config, intermediate_size=4096)))
    assert exact_margin(models, [[5]]) is None
    assert exact_margin(models / "absent", [[5]]) is None


def test_weights_that_are_not_the_tiny_targets_are_one_clear_error(models):
    (models / "target" / "model.safetensors").write_bytes(b"not safetensors")
    margin = exact_margin(models, [[5, 6]])
    with pytest.raises(UserError, match="not the tiny target's weights"):
        margin(0, [], 1, 2)


def test_a_finished_runs_divergences_are_judged_again_with_the_exact_model(models, tmp_path, capsys):
    from proving_ground import exact

    oracle = {"prompts": [{"input_ids": [5, 6, 7], "ar_output_ids": [20, 21, 22, 23]}]}
    margin = exact_margin(models, [[5, 6, 7]])(0, [20, 21], 22, 30)
    report = {"eps": 0.05, "speed": [
        {"server": "dflash-weak", "cell": "greedy-c1", "verdict": "FAIL",
         "divergences": [{"prompt": 0, "position": 2, "reference_token": 22, "got_token": 30, "gap": 2.25,
                          "tie": False}]},
        {"server": "ar", "cell": "greedy-c1", "verdict": "exact", "divergences": []}]}
    paths = {name: tmp_path / f"{name}.json" for name in ("oracle", "report")}
    paths["oracle"].write_text(json.dumps(oracle))
    paths["report"].write_text(json.dumps(report))
    args = ["--models", str(models), "--oracle", str(paths["oracle"]), "--report", str(paths["report"])]
    assert exact.main(args + ["--exact-eps", str(abs(margin) + 0.01)]) == 0
    assert capsys.readouterr().out.startswith("greedy-c1 dflash-weak: lossless (ties only) (p0@2 gap 2.25 exact")
    assert exact.main(args + ["--exact-eps", str(abs(margin) - 0.01)]) == 0
    assert capsys.readouterr().out.startswith("greedy-c1 dflash-weak: FAIL")
    paths["report"].write_text("{")
    assert exact.main(args) == 2
    assert capsys.readouterr().err.startswith("exact: error: JSONDecodeError")
