"""`k26-deploy bundle` (REPRODUCE.md's air-gapped install) as a user starts it: it says what it is
about to build and download before pip starts, and a failed download leaves nothing behind.
Real pip against a package index on 127.0.0.1 that has none of the wheels."""

from __future__ import annotations

import os
import subprocess
import sys

from k26_ddtree.repro import bundle
from repro_helpers import local_index


def _bundle(cwd, index_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=index_url, PIP_RETRIES="0",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([sys.executable, "-m", "k26_ddtree", "bundle", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_bare_bundle_says_what_it_will_write_and_download_before_it_starts(tmp_path):
    here = tmp_path / "cwd"
    here.mkdir()
    cache = tmp_path / "cache"
    with local_index() as index:
        result = _bundle(here, index, "--cache", str(cache))
    lines = result.stdout.splitlines()
    assert lines and lines[0].startswith(f"bundle: will write {here}/k26-site-py3.12-sm90.tar.xz "
                                         "(--out picks the folder)"), result.stdout
    assert f"{len(bundle.REQUIREMENTS)} of their wheels are not in {cache} and are downloaded first" in lines[0]
    assert lines[1].startswith("bundle: downloading"), result.stdout
    assert result.returncode == 1, result.stdout + result.stderr
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("k26-deploy: error: pip download failed for "), result.stderr
    assert list(here.iterdir()) == [], "a failed download wrote into the output folder"
