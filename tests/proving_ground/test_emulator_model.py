"""The emulated model class and folder: config rewriting, and SGLang 0.5.11 (pinned, on the CPU)
loading the class through SGLANG_EXTERNAL_MODEL_PACKAGE while keeping DeepseekV3's MLA setup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proving_ground.emulator import folder
from proving_ground.emulator.calibration import CalibrationError, Costs
from proving_ground.tinymodel import TARGET_CONFIG

REPO = Path(__file__).resolve().parents[2]
STUBS = REPO / "tests" / "sglang_cpu" / "stubs"
NO_SUBTRACT = {"decode": 0.0, "target_verify": 0.0, "extend": 0.0}


@pytest.fixture
def target(tmp_path) -> Path:
    t = tmp_path / "target"
    t.mkdir()
    (t / "config.json").write_text(json.dumps(TARGET_CONFIG))
    (t / "model.safetensors").write_bytes(b"weights")
    (t / "tokenizer.json").write_text("{}")
    return t


def test_emulated_config(target):
    config = folder.emulated_config(TARGET_CONFIG, "nvlink-tp8-nvls", 0.5, dict(NO_SUBTRACT, decode=900.0))
    assert config["architectures"] == [folder.EMULATED_ARCH, folder.TARGET_ARCH]
    block = config["k26_emulator"]
    assert block["box"] == "nvlink-tp8-nvls" and block["subtract_us"]["decode"] == 900.0
    costs = Costs.from_block(block["costs"])
    assert costs.rho == 0.5 and costs.layout == "tp" and costs.fixed_us > 0
    assert {k: v for k, v in config.items() if k not in ("architectures", "k26_emulator")} == \
        {k: v for k, v in TARGET_CONFIG.items() if k != "architectures"}
    with pytest.raises(CalibrationError):
        folder.emulated_config(dict(TARGET_CONFIG, architectures=["Qwen3ForCausalLM"]), "pcie-ep8", None, NO_SUBTRACT)
    with pytest.raises(CalibrationError):
        folder.emulated_config(TARGET_CONFIG, "pcie-ep8", None, dict(NO_SUBTRACT, extend=float("nan")))


def _folder_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proving_ground.emulator.folder", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_folder_cli_links_the_weights_and_refuses_an_existing_folder(target, tmp_path):
    out = tmp_path / "emulated"
    done = _folder_cli("--target", target, "--out", out, "--box", "pcie-ep8", "--subtract-verify-us", "4000")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["subtract_us"]["target_verify"] == 4000.0
    assert os.path.samefile(out / "model.safetensors", target / "model.safetensors")
    assert (out / "tokenizer.json").read_text() == "{}"
    assert json.loads((out / "config.json").read_text())["architectures"][0] == folder.EMULATED_ARCH
    for args in (("--target", target, "--out", out, "--box", "pcie-ep8"),
                 ("--target", target, "--out", tmp_path / "x", "--box", "nope"),
                 ("--target", tmp_path / "none", "--out", tmp_path / "y", "--box", "pcie-ep8"),
                 ("--target", target, "--out", tmp_path / "z", "--box", "pcie-ep8", "--subtract-decode-us", "-1")):
        bad = _folder_cli(*args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


SGLANG_CHECK = textwrap.dedent("""
    import sys, torch
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    model_config = ModelConfig(sys.argv[1])
    assert model_config.attention_arch == AttentionArch.MLA, model_config.attention_arch
    cls, arch = ModelRegistry.resolve_model_cls(model_config.hf_config.architectures)
    print("resolved", arch, cls.__module__)
    if arch != "K26EmulatedDeepseekV3ForCausalLM":
        sys.exit(0)
    assert issubclass(cls, DeepseekV3ForCausalLM)

    # forward returns the parent's output object untouched and adds the wait after it.
    import proving_ground.emulator.model as emulated
    calls = []
    sentinel = object()
    DeepseekV3ForCausalLM.forward = lambda self, *a: calls.append("parent") or sentinel
    emulated.step_wait = lambda costs, sub, fb, n: calls.append(("wait", costs.box, n))
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    model.k26_costs = emulated.Costs.from_block(model_config.hf_config.k26_emulator["costs"])
    model.k26_subtract_us = model_config.hf_config.k26_emulator["subtract_us"]
    out = model.forward(torch.zeros(9, dtype=torch.long), torch.arange(9), object())
    assert out is sentinel and calls == ["parent", ("wait", "pcie-ep8", 9)], calls
    print("forward ok")
""")


def _sglang_env(site: Path, external: bool) -> dict:
    models = site / "sglang" / "srt" / "models"
    # Only deepseek_v2 is imported from SGLang's own model modules: the rest cost minutes on 2 cores.
    others = sorted(p.stem for p in models.glob("*.py") if p.stem not in ("deepseek_v2", "registry", "__init__"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, (site, STUBS, REPO))),
               SGLANG_DISABLED_MODEL_ARCHS=",".join(others))
    env.pop("SGLANG_EXTERNAL_MODEL_PACKAGE", None)
    if external:
        env["SGLANG_EXTERNAL_MODEL_PACKAGE"] = folder.EXTERNAL_PACKAGE
    return env


@pytest.mark.parametrize("external", [True, False], ids=["registered", "not-registered"])
def test_pinned_sglang_loads_the_class(pristine_sglang, target, tmp_path, external):
    out = tmp_path / "emulated"
    folder.make_emulated(target, out, "pcie-ep8", None, NO_SUBTRACT)
    done = subprocess.run([sys.executable, "-c", SGLANG_CHECK, str(out)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=_sglang_env(pristine_sglang, external))
    assert done.returncode == 0, done.stderr[-3000:]
    if external:
        assert "resolved K26EmulatedDeepseekV3ForCausalLM proving_ground.emulator.model" in done.stdout
        assert "forward ok" in done.stdout
    else:  # without the variable SGLang serves the plain target: why the model logs what it emulates
        assert "resolved DeepseekV3ForCausalLM sglang.srt.models.deepseek_v2" in done.stdout
