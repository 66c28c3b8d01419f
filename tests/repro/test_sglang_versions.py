"""The SGLang versions the install paths know: each row's pins, checked against that version's
real wheel (its Requires-Dist), and the one-line refusal of a version not in the table."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.patchset.wheel import default_cache
from k26_ddtree.repro.bundle import parse_pin
from k26_ddtree.repro.sglang_versions import DEFAULT, PINS, pins_for

REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^;\s]+)\s*(;.*)?")


def test_the_default_is_a_known_version_and_every_row_is_keyed_by_its_own_version():
    assert DEFAULT in PINS
    assert pins_for(None) is PINS[DEFAULT]
    for version, pins in PINS.items():
        assert pins.sglang == version
        assert pins_for(version) is pins


@pytest.mark.parametrize("version", sorted(PINS))
def test_each_bundle_list_pins_its_own_sglang_once_per_package(version):
    pins = PINS[version]
    names = [parse_pin(spec)[0] for spec in pins.bundle]
    assert len(names) == len(set(names)), "a package listed twice"
    assert all(parse_pin(spec)[1] for spec in pins.bundle), "every bundled package is pinned NAME==VERSION"
    assert pins.bundled("sglang") == version
    assert {"sglang-kernel", "flashinfer-python", "transformers", "tokenizers"} <= set(names)
    assert "torch" not in names and "triton" not in names, "the GPU image's own torch and triton serve"


def test_what_0_5_17_bundles_differently_from_0_5_11():
    old, new = set(PINS["0.5.11"].bundle), set(PINS["0.5.17"].bundle)
    assert sorted(new - old) == [
        "apache-tvm-ffi==0.1.11", "flashinfer-python==0.6.15.post1", "sgl-deep-gemm==0.1.5.post1",
        "sglang-kernel==0.4.5", "sglang==0.5.17", "transformers==5.12.1", "xgrammar==0.2.1"]
    assert sorted(old - new) == [
        "apache-tvm-ffi==0.1.15.post2", "flashinfer-python==0.6.8.post1", "sglang-kernel==0.4.2",
        "sglang==0.5.11", "transformers==5.6.0"]


@pytest.mark.parametrize("asked", ["0.5.99", "latest", "", "0.5.11 ", "../0.5.11"])
def test_an_unknown_version_is_one_line_naming_the_known_ones(asked):
    with pytest.raises(UserError) as refused:
        pins_for(asked)
    message = str(refused.value)
    assert refused.value.code == 2 and "\n" not in message
    assert message.endswith("not a version k26-ddtree installs; known: 0.5.11 (default), 0.5.17")


def test_the_module_answers_for_the_shell_front_doors():
    """env/quickstart.sh asks `python -m k26_ddtree.repro.sglang_versions VERSION` before anything runs."""
    def ask(*args):
        return subprocess.run([sys.executable, "-m", "k26_ddtree.repro.sglang_versions", *args],
                              capture_output=True, text=True, timeout=60)

    assert ask("0.5.17").stdout == "torch 2.11.0 + sglang 0.5.17\n"
    assert ask().stdout == f"torch {PINS[DEFAULT].torch} + sglang {DEFAULT}\n"
    wrong = ask("0.5.99")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr == "error: --sglang 0.5.99: not a version k26-ddtree installs; known: 0.5.11 (default), 0.5.17\n"


def _sglang_wheel(version: str) -> Path:
    """sglang VERSION's cp311 wheel in the suite's wheel cache (downloaded once, no dependencies)."""
    cache = default_cache()
    wheel = cache / f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "--platform", "manylinux_2_34_x86_64", "--python-version", "3.11", "--implementation", "cp",
                        "--abi", "cp311", f"sglang=={version}", "-d", str(cache)], check=True, timeout=600)
    return wheel


@pytest.mark.network
@pytest.mark.parametrize("version", sorted(PINS))
def test_pins_agree_with_the_wheels_own_requirements(version):
    """Where the wheel pins a package exactly, the table carries that version (torch too); a bundled
    package the wheel pins another way must still be one the wheel names."""
    pins = PINS[version]
    with zipfile.ZipFile(_sglang_wheel(version)) as wheel:
        metadata = wheel.read(f"sglang-{version}.dist-info/METADATA").decode()
    requires = Parser().parsestr(metadata).get_all("Requires-Dist")
    exact = {}
    for line in requires:
        match = REQUIREMENT.fullmatch(line.strip())
        if match and "extra ==" not in (match.group(4) or ""):
            exact[parse_pin(match.group(1))[0]] = match.group(3)
    assert exact["torch"] == pins.torch and exact["torchaudio"] == pins.torchaudio
    bundled = dict(parse_pin(spec) for spec in pins.bundle)
    for name in ("sglang-kernel", "flashinfer-python", "transformers"):
        assert bundled[name] == exact[name], name
    agreeing = {name: v for name, v in bundled.items() if name in exact}
    assert agreeing == {name: exact[name] for name in agreeing}
