"""The wheel ships the product and the data it reads, nothing else: built from this checkout
with the real build backend, then listed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from k26_ddtree import resources

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    src = tmp_path_factory.mktemp("src")
    # A copy without the checkout's venvs and caches: the backend builds what git would clone.
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in tracked.decode().split("\0"):
        if rel and (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out), str(src)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = out.glob("k26_ddtree-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_the_wheel_holds_the_package_and_its_data_only(wheel_names):
    tops = {name.split("/")[0] for name in wheel_names}
    assert tops == {"k26_ddtree", next(t for t in tops if t.endswith(".dist-info"))}
    assert not [n for n in wheel_names if "proving_ground" in n or "/results/" in n or n.endswith(".log")]
    data = sorted({"/".join(n.split("/")[2:]) for n in wheel_names if n.startswith("k26_ddtree/_data/")})
    for parts in resources.SHIPPED_DATA:
        prefix = "/".join(parts)
        assert any(d == prefix or d.startswith(prefix + "/") for d in data), prefix
    stray = [d for d in data if not any(d == "/".join(p) or d.startswith("/".join(p) + "/")
                                        for p in resources.SHIPPED_DATA)]
    assert stray == []


def test_no_training_or_toy_model_code_ships(wheel_names):
    modules = [n for n in wheel_names if n.endswith(".py")]
    assert not [n for n in modules if re.search(r"/(train|tinymodel|e2e|widen|oracle|matrix)\.py$", n)]
    assert "k26_ddtree/repro/bundle.py" in modules, "the offline bundle is a user-facing tool"


def test_the_coding_tasks_and_every_patch_set_pin_ship(wheel_names):
    assert "k26_ddtree/_data/bench/coding_tasks.yaml" in wheel_names
    pins = [n for n in wheel_names if n.startswith("k26_ddtree/_data/patches/") and n.endswith("/pins.json")]
    assert pins and len(pins) == len(list((ROOT / "patches").glob("sglang-*/pins.json")))


def test_pyproject_force_includes_exactly_the_shipped_data():
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.hatch.build.targets.wheel.force-include]", 1)[1].split("\n[", 1)[0]
    included = sorted(re.findall(r'^"([^"]+)" = "k26_ddtree/_data/\1"$', section, re.M))
    assert included == sorted("/".join(p) for p in resources.SHIPPED_DATA)
