"""Which SGLang version a unit is written for, and the known-bad pairings of hardware and version,
refused in one line (exit 2) by env/quickstart.sh before anything is installed and by render,
install and reconfigure.

The installed version is read from a real venv whose python finds the pinned wheel's pristine
sglang and dist-info (a .pth file), as `k26-deploy apply` reads it: never by importing sglang.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy_helpers import REPO, exec_start_words, k26, one_line_error

from k26_ddtree.deploy.units import profile_from_unit

pytestmark = pytest.mark.network

NVLINK_0_5_17 = (
    "SGLang 0.5.17 is known to fail on the 8x B300 (sm_103) of profile nvlink-tp8-nvls: --bf16-gemm-backend auto "
    "picks the CuTeDSL TGV BF16 GEMM on SM103, which raises Xid 13 \"CTA Not Present\" on B300 with flashinfer "
    "0.6.15.post1 (SGLang #34340, open), and draft CUDA-graph capture on sm_103 crashes in an sm100f trtllm batched "
    "GEMM since 0.5.12's flashinfer (SGLang #25563); use --sglang 0.5.11")
RENDER = ("render", "--allow-missing-model", "--no-verify")


def quickstart(*args: str, venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "env" / "quickstart.sh"), "--venv", str(venv), *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})


def pairings(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k26_ddtree.deploy.pairings", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


@pytest.mark.parametrize("args", [["--profile", "nvlink-tp8-nvls", "--sglang", "0.5.17"],
                                  ["--sglang=0.5.17", "--profile=nvlink-tp8-nvls"]])
def test_quickstart_refuses_a_version_known_to_fail_on_the_profiles_hardware_before_anything_runs(tmp_path, args):
    venv = tmp_path / "venv"
    proc = quickstart(*args, venv=venv)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.splitlines() == [f"quickstart: error: {NVLINK_0_5_17}"]
    assert not venv.exists()


def test_the_pairing_check_passes_the_pairings_nothing_is_known_against():
    for args in (["--sglang", "0.5.17", "--profile", "pcie-ep8"], ["--sglang", "0.5.17", "--profile", "pcie-ep4-tp2"],
                 ["--profile", "nvlink-tp8-nvls"], ["--sglang", "0.5.11", "--profile", "nvlink-tp8-nvls"],
                 ["--sglang", "0.5.17"], ["--sglang", "0.5.17", "--profile", "mine/extends-nvlink.yaml"]):
        proc = pairings(*args)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", ""), args
    refused = pairings("--sglang", "0.5.17", "--profile", "nvlink-tp8-nvls")
    assert (refused.returncode, refused.stderr) == (2, f"error: {NVLINK_0_5_17}\n")
    unknown = pairings("--sglang", "0.5.99", "--profile", "nvlink-tp8-nvls")
    assert unknown.stderr == "error: --sglang 0.5.99: not a version k26-ddtree installs; known: 0.5.11 (default), 0.5.17\n"


def test_a_profile_naming_a_version_known_to_fail_on_its_hardware_is_refused(tmp_path):
    line = one_line_error(k26(*RENDER, "--profile", "nvlink-tp8-nvls", "--set", "sglang_version=0.5.17"))
    assert line == f"k26-deploy: error: profile nvlink-tp8-nvls: sglang_version 0.5.17: {NVLINK_0_5_17}"
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: nvlink-tp8-nvls\nsglang_version: '0.5.17'\nport: 31000\n")
    assert one_line_error(k26(*RENDER, "--profile", str(mine))).endswith(f"sglang_version 0.5.17: {NVLINK_0_5_17}")
    unknown = one_line_error(k26(*RENDER, "--profile", "pcie-ep8", "--set", "sglang_version=0.5.12"))
    assert unknown == ("k26-deploy: error: profile pcie-ep8: sglang_version must be one of 0.5.11 (default), 0.5.17, "
                       "got '0.5.12'")
    for name in ("pcie-ep8", "pcie-ep4-tp2"):
        proc = k26(*RENDER, "--profile", name, "--set", "sglang_version=0.5.17")
        assert proc.returncode == 0, proc.stderr
        assert "--cuda-graph-max-bs-decode" in exec_start_words(proc.stdout)


def _venv(root: Path, site: Path) -> Path:
    """A venv whose python imports the sglang in `site` (a .pth file names it); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    (site_packages,) = root.glob("lib/python*/site-packages")
    (site_packages / "sglang-site.pth").write_text(f"{site}\n", encoding="utf-8")
    return root / "bin" / "python"


@pytest.fixture(scope="module")
def python_with(pristine_sources, tmp_path_factory):
    """python_with(version): the python of a venv with the pristine sglang `version` installed."""
    made: dict[str, Path] = {}

    def python(version: str) -> Path:
        if version not in made:
            made[version] = _venv(tmp_path_factory.mktemp(f"venv-{version}"), pristine_sources(version))
        return made[version]

    return python


def test_render_writes_the_unit_for_the_sglang_its_python_has(python_with):
    python = python_with("0.5.17")
    proc = k26(*RENDER, "--profile", "pcie-ep8", "--set", f"python={python}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"k26-deploy: note: profile pcie-ep8 names SGLang 0.5.11 (sglang_version); {python} has sglang 0.5.17: "
        "the unit is written for 0.5.17"]
    words = exec_start_words(proc.stdout)
    assert words[words.index("--cuda-graph-max-bs-decode") + 1] == "16" and "--cuda-graph-max-bs" not in words
    assert profile_from_unit(proc.stdout, "the unit").sglang_version == "0.5.17"
    assert "(budget 8, topk 4, block 8, spine off, SGLang 0.5.17)" in proc.stdout
    same = k26(*RENDER, "--profile", "pcie-ep8", "--set", f"python={python_with('0.5.11')}")
    assert same.returncode == 0 and same.stderr == "", same.stderr
    assert "--cuda-graph-max-bs" in exec_start_words(same.stdout)


def test_render_install_and_reconfigure_refuse_a_python_whose_sglang_fails_on_the_hardware(python_with, tmp_path):
    python = python_with("0.5.17")
    expected = f"k26-deploy: error: {python} has sglang 0.5.17: {NVLINK_0_5_17}"
    root = tmp_path / "root"
    root.mkdir()
    for args in ((*RENDER, "--profile", "nvlink-tp8-nvls"),
                 ("install", "--allow-missing-model", "--profile", "nvlink-tp8-nvls", "--root", str(root)),
                 ("reconfigure", "--dry-run", "--allow-missing-model", "--profile", "nvlink-tp8-nvls")):
        assert one_line_error(k26(*args, "--set", f"python={python}")) == expected, args
    assert list(root.iterdir()) == [], "nothing was written"
    fine = k26(*RENDER, "--profile", "nvlink-tp8-nvls", "--set", f"python={python_with('0.5.11')}")
    assert fine.returncode == 0 and fine.stderr == "", fine.stderr


def test_a_python_with_an_sglang_k26_ddtree_does_not_serve_is_refused(pristine_sources, tmp_path):
    pristine = pristine_sources("0.5.11")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sglang").symlink_to(pristine / "sglang")
    dist_info = shutil.copytree(pristine / "sglang-0.5.11.dist-info", site / "sglang-0.5.12.dist-info")
    metadata = dist_info / "METADATA"
    metadata.write_text(metadata.read_text(encoding="utf-8").replace("Version: 0.5.11", "Version: 0.5.12", 1),
                        encoding="utf-8")
    python = _venv(tmp_path / "venv", site)
    line = one_line_error(k26(*RENDER, "--profile", "pcie-ep8", "--set", f"python={python}"))
    assert line == (f"k26-deploy: error: {python} has sglang 0.5.12, which k26-ddtree does not serve; install one it "
                    "does: 0.5.11 (default), 0.5.17")


def test_without_sglang_here_the_unit_is_written_for_the_profiles_version(tmp_path):
    """The suite's python has no sglang installed; a python on another machine is not here at all."""
    for python in (sys.executable, "/opt/elsewhere/bin/python"):
        proc = k26(*RENDER, "--profile", "pcie-ep8", "--set", f"python={python}", "--set", "sglang_version=0.5.17")
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert profile_from_unit(proc.stdout, "the unit").sglang_version == "0.5.17"


def test_a_python_that_does_not_answer_is_one_line():
    false = shutil.which("false")
    line = one_line_error(k26(*RENDER, "--profile", "pcie-ep8", "--set", f"python={false}"))
    assert line == f"k26-deploy: error: python {false} does not answer where its sglang is (exit 1)"
