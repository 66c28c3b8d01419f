"""The exact model the lossless rule asks: the trained target's weights computed in fp32."""

import json

import pytest
import torch

from k26_ddtree.errors import UserError
from proving_ground import exact, tinymodel
from proving_ground.exact import exact_model

pytest.importorskip("safetensors")


@pytest.fixture
def models(tmp_path):
    target = tinymodel.TinyDeepseekV3()
    tinymodel.init_weights(target, 3)
    tinymodel.save_checkpoint(target, tinymodel.TARGET_CONFIG, tmp_path / "models" / "target")
    return tmp_path / "models"


def fp32_logits(models, ids):
    from safetensors.torch import load_file

    target = tinymodel.TinyDeepseekV3()
    target.load_state_dict({k: v.float() for k, v in load_file(str(models / "target" / "model.safetensors")).items()})
    with torch.no_grad():
        return target(torch.tensor([ids]))[0][0, -1].double()


def test_below_top_is_how_far_each_token_lies_under_the_fp32_top_logit(models):
    below = exact_model(models, [[5, 6, 7], [9, 10]])
    logits = fp32_logits(models, [9, 10, 11, 12])
    top = int(logits.argmax())
    a, b = below(1, [11, 12], 40, top)
    assert a == pytest.approx(float(logits[top] - logits[40]), abs=1e-5) and b == 0.0
    assert below(1, [11, 12], top, 40) == (b, a)


def test_an_emulated_folder_has_the_exact_model_and_a_widened_one_has_none(models):
    config = json.loads((models / "target" / "config.json").read_text())
    emulated = dict(config, architectures=["K26EmulatedDeepseekV3ForCausalLM", "DeepseekV3ForCausalLM"],
                    k26_emulator={"box": "pcie-ep8"})
    (models / "target" / "config.json").write_text(json.dumps(emulated))
    assert exact_model(models, [[5]]) is not None
    (models / "target" / "config.json").write_text(json.dumps(dict(config, intermediate_size=4096)))
    assert exact_model(models, [[5]]) is None
    assert exact_model(models / "absent", [[5]]) is None


def test_weights_that_are_not_the_tiny_targets_are_one_clear_error(models):
    (models / "target" / "model.safetensors").write_bytes(b"not safetensors")
    below = exact_model(models, [[5, 6]])
    with pytest.raises(UserError, match="not the tiny target's weights"):
        below(0, [], 1, 2)


@pytest.fixture
def finished_run(models, tmp_path):
    """(CLI args, the report, the exact model's (top, below of token 30)) of a made-up speed run
    whose one speculative cell parted from AR at p0@2 where AR's gap was 2.25."""
    oracle = {"prompts": [{"input_ids": [5, 6, 7], "ar_output_ids": [20, 21, 22, 23]}]}
    logits = fp32_logits(models, [5, 6, 7, 20, 21])
    top = int(logits.argmax())
    report = {"eps": 0.05, "prompts": 1, "speed": [
        {"server": "dflash-weak", "cell": "greedy-c1", "verdict": "FAIL", "divergence_count": 1, "repeat_tok_s": [9.0],
         "divergences": [{"prompt": 0, "position": 2, "reference_token": 22, "got_token": top, "gap": 2.25,
                          "tie": False}]},
        {"server": "ar", "cell": "greedy-c1", "verdict": "exact", "divergences": [], "repeat_tok_s": [9.0]},
        {"server": "ar", "cell": "greedy-c64", "verdict": "exact", "divergences": [], "repeat_tok_s": []}]}
    paths = {name: tmp_path / f"{name}.json" for name in ("oracle", "report")}
    paths["oracle"].write_text(json.dumps(oracle))
    paths["report"].write_text(json.dumps(report))
    args = ["--models", str(models), "--oracle", str(paths["oracle"]), "--report", str(paths["report"])]
    return args, report, paths, float(logits[top] - logits[22])


def test_a_finished_runs_divergences_are_judged_again_with_the_exact_model(finished_run, capsys):
    args, report, paths, below_ref = finished_run
    assert exact.main(args + ["--exact-eps", str(below_ref + 0.01)]) == 0
    assert capsys.readouterr().out.startswith("greedy-c1 dflash-weak: lossless (ties only) (p0@2 gap 2.250 "
                                              "(exact below top-1:")
    assert exact.main(args + ["--exact-eps", str(below_ref - 0.01)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("greedy-c1 dflash-weak: FAIL") and "greedy-c64" not in out, "an unmeasured cell is not judged"
    # request errors, or divergences the summary did not list, fail a cell whatever the listed ones say
    for extra in ({"errors": 2}, {"divergence_count": 21}):
        paths["report"].write_text(json.dumps(dict(report, speed=[dict(report["speed"][0], **extra)])))
        assert exact.main(args + ["--exact-eps", str(below_ref + 0.01)]) == 1
        assert capsys.readouterr().out.startswith("greedy-c1 dflash-weak: FAIL")


@pytest.mark.parametrize("report_change, oracle_change, message", [
    ({"speed": {}}, None, "not an e2e-runRUN.json of a speed run"),
    ({"eps": None}, None, "not an e2e-runRUN.json of a speed run"),
    ({"prompts": 2}, None, "not the same run"),
    (None, {"prompts": [{"input_ids": [5, 6, 7], "ar_output_ids": [20, 21, 99, 23]}]}, "not the same run"),
    (None, {"prompts": "x"}, "no list of prompts"),
    (None, {"prompts": [{"input_ids": [5.5], "ar_output_ids": [20, 21, 22]}]}, "not as the runner writes it"),
])
def test_files_that_disagree_or_are_not_a_runs_are_one_line_and_exit_2(finished_run, capsys, report_change,
                                                                       oracle_change, message):
    args, report, paths, _ = finished_run
    if report_change is not None:
        changed = {k: v for k, v in dict(report, **report_change).items() if v is not None}
        paths["report"].write_text(json.dumps(changed))
    if oracle_change is not None:
        paths["oracle"].write_text(json.dumps(oracle_change))
    assert exact.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("exact: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_bad_arguments_are_one_line_and_exit_2(finished_run, capsys, tmp_path):
    args, _, paths, _ = finished_run
    assert exact.main(args + ["--exact-eps", "nan"]) == 2
    assert "expected a finite number of nats > 0" in capsys.readouterr().err
    assert exact.main(["--models", str(tmp_path / "none")] + args[2:]) == 2
    assert "missing, or not the tiny target" in capsys.readouterr().err
    paths["report"].write_text("{")
    assert exact.main(args) == 2
    assert capsys.readouterr().err.startswith("exact: error: JSONDecodeError")


def test_the_reference_itself_is_judged_at_every_position_against_the_exact_model(models, tmp_path, capsys):
    prompt, output = [5, 6, 7], []
    for _ in range(4):
        output.append(int(fp32_logits(models, prompt + output).argmax()))
    oracle = tmp_path / "oracle.json"
    oracle.write_text(json.dumps({"prompts": [{"input_ids": prompt, "ar_output_ids": output}]}))
    args = ["--models", str(models), "--oracle", str(oracle), "--reference"]
    assert exact.main(args) == 0
    assert capsys.readouterr().out == "reference: 0 of 4 tokens more than 0.25 nats below the exact model's top-1\n"
    logits = fp32_logits(models, prompt + output[:3])
    worst = int(logits.argmin())
    oracle.write_text(json.dumps({"prompts": [{"input_ids": prompt, "ar_output_ids": output[:3] + [worst]}]}))
    assert exact.main(args) == 1
    first, last = capsys.readouterr().out.splitlines()
    below = float(logits.max() - logits[worst])
    assert first == (f"p0@3: the reference's token {worst} lies {below:.3f} nats below the exact model's "
                     f"top-1 {output[3]}")
    assert last.startswith("reference: 1 of 4 tokens")
    assert exact.main(args + ["--exact-eps", str(below + 1)]) == 0
    assert exact.main(["--models", str(tmp_path / "none"), "--oracle", str(oracle), "--reference"]) == 2
    assert "missing, or not the tiny target" in capsys.readouterr().err
