"""`k26-deploy bundle` (REPRODUCE.md's air-gapped install) as a user starts it: it says what it is
about to build and download before pip starts, and a failed download leaves nothing behind.
Real pip against a package index on 127.0.0.1 that has none of the wheels."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from k26_ddtree.repro.sglang_versions import DEFAULT, PINS
from repro_helpers import local_index


def _bundle(cwd, index_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=index_url, PIP_RETRIES="0",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([sys.executable, "-m", "k26_ddtree", "bundle", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("version", [None, "0.5.17"])
def test_a_bare_bundle_says_what_it_will_write_and_download_before_it_starts(tmp_path, version):
    here = tmp_path / "cwd"
    here.mkdir()
    cache = tmp_path / "cache"
    chosen = ("--sglang", version) if version else ()
    pins = PINS[version or DEFAULT]
    with local_index() as index:
        result = _bundle(here, index, "--cache", str(cache), *chosen)
    lines = result.stdout.splitlines()
    assert lines and lines[0].startswith(f"bundle: will write {here}/k26-site-py3.12-sm90.tar.xz "
                                         f"(--out picks the folder) for sglang {pins.sglang} "
                                         f"from {len(pins.bundle)} packages; "), result.stdout
    assert f"{len(pins.bundle)} of their wheels are not in {cache} and are downloaded first" in lines[0]
    assert lines[1].startswith("bundle: downloading"), result.stdout
    assert result.returncode == 1, result.stdout + result.stderr
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("k26-deploy: error: pip download failed for "), result.stderr
    assert list(here.iterdir()) == [], "a failed download wrote into the output folder"


def test_an_unknown_version_is_refused_before_anything_is_downloaded(tmp_path):
    with local_index() as index:
        result = _bundle(tmp_path, index, "--sglang", "0.5.99", "--cache", str(tmp_path / "cache"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "k26-deploy: error: --sglang 0.5.99: not a version k26-ddtree installs; known: 0.5.11 (default), 0.5.17"]
    assert list(tmp_path.iterdir()) == []
