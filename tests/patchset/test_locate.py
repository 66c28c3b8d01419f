"""Finding sglang and its version by reading files, never importing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.patchset.locate import locate
from k26_ddtree.patchset.pins import DEFAULT_VERSION

REPO = Path(__file__).resolve().parents[2]


def test_the_site_dir_or_the_package_dir_may_be_given(site):
    for given in (site, site / "sglang", str(site) + "/"):
        found = locate(given)
        assert found.site == site and found.version == DEFAULT_VERSION
        assert found.version_source == f"sglang-{DEFAULT_VERSION}.dist-info"


def test_a_dir_without_sglang_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="no sglang package"):
        locate(tmp_path)


def test_without_dist_info_the_version_comes_from_the_source(site):
    for dist_info in site.glob("*.dist-info"):
        for path in sorted(dist_info.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        dist_info.rmdir()
    found = locate(site)
    assert found.version == DEFAULT_VERSION
    assert "sglang/_version.py" in found.version_source and "no sglang dist-info" in found.version_source


def test_conflicting_dist_infos_are_refused(site):
    stale = site / "sglang-0.5.9.dist-info"
    stale.mkdir()
    (stale / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n\nbody\n")
    with pytest.raises(UserError, match="several sglang versions"):
        locate(site)


def test_other_distributions_do_not_count(site):
    other = site / "sglang_router-0.3.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-router\nVersion: 0.3.0\n")
    assert locate(site).version == DEFAULT_VERSION


def test_the_finder_locates_sglang_without_importing_it(site):
    probe = ("import json, sys\nfrom k26_ddtree.patchset.locate import locate\n"
             "found = locate()\n"
             "print(json.dumps([str(found.site), found.version, 'sglang' in sys.modules]))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == [str(site), DEFAULT_VERSION, False]


def test_no_sglang_anywhere_says_how_to_point_at_one():
    probe = "from k26_ddtree.patchset.locate import locate\nlocate()\n"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--sglang-dir" in done.stderr
