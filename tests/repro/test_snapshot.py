"""`k26-deploy snapshot`: every item recorded, "none" without GPUs, "not available" without tools."""

from __future__ import annotations

import json
from pathlib import Path

from k26_ddtree.deploy.units import PROFILE_MARK
from k26_ddtree.repro import snapshot
from repro_helpers import cpu_path, run_cli

ITEMS = {"os", "kernel", "driver", "cuda-toolkit", "gpus", "topology", "python", "pip-freeze", "patchset",
         "unit", "service-status", "profile"}


def _index(folder: Path) -> dict:
    return json.loads((folder / "index.json").read_text())


def test_cpu_snapshot_records_every_item(tmp_path):
    out = tmp_path / "snap"
    result = run_cli("snapshot", "--out", str(out), path=cpu_path())
    assert result.returncode == 0, result.stderr
    assert f"snapshot: written to {out}" in result.stdout
    index = _index(out)
    assert set(index["items"]) == ITEMS
    for name, entry in index["items"].items():
        assert (out / entry["file"]).is_file(), name
        assert entry["status"] in {"ok", "none", "not available", "failed"}, (name, entry)
    for gpu_item in ("gpus", "topology", "driver"):
        assert index["items"][gpu_item]["status"] == "none"
        assert (out / f"{gpu_item}.txt").read_text() == "none\n"
    assert "pytest==" in (out / "pip-freeze.txt").read_text()
    assert "VERSION_ID" in (out / "os.txt").read_text() or "not available" in (out / "os.txt").read_text()
    patchset = index["items"]["patchset"]
    assert patchset["source"].endswith("-m k26_ddtree apply --check")
    assert patchset["status"] == "not available" or patchset["exit_code"] is not None
    assert index["items"]["profile"]["status"] in {"ok", "none"}


def test_snapshot_never_fails_when_tools_are_missing(tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    out = tmp_path / "snap"
    result = run_cli("snapshot", "--out", str(out), path=str(empty_bin))
    assert result.returncode == 0, result.stderr
    items = _index(out)["items"]
    assert items["unit"]["status"] == "not available"
    assert "not available" in (out / "unit.txt").read_text()
    assert items["cuda-toolkit"]["status"] in {"ok", "not available"}  # /usr/local/cuda-* is read by path
    assert items["gpus"]["status"] == "none"


def test_gpu_snapshot_records_gpu_list_and_topology(tmp_path, fake_gpu_path):
    out = tmp_path / "snap"
    result = run_cli("snapshot", "--out", str(out), path=fake_gpu_path(name="NVIDIA B300"))
    assert result.returncode == 0, result.stderr
    gpus = (out / "gpus.txt").read_text().splitlines()
    assert len(gpus) == 8 and gpus[0].startswith("GPU 0: NVIDIA B300")
    assert "NV18" in (out / "topology.txt").read_text()
    assert _index(out)["items"]["topology"]["status"] == "ok"


def test_default_folder_is_env_snapshots_and_existing_out_is_refused(tmp_path):
    result = run_cli("snapshot", "--root", str(tmp_path), path=cpu_path())
    assert result.returncode == 0, result.stderr
    made = list((tmp_path / "env" / "snapshots").iterdir())
    assert len(made) == 1 and made[0].name.startswith("snapshot-") and made[0].name.endswith("Z")
    assert not [p for p in made[0].parent.iterdir() if p.name.startswith(".")], "no staging dir left"
    again = run_cli("snapshot", "--out", str(made[0]), path=cpu_path())
    assert again.returncode == 2
    assert "already exists; choose another --out" in again.stderr


def test_profile_is_read_from_the_unit_k26_deploy_rendered():
    unit = f"# k26-ddtree.service\n{PROFILE_MARK}{json.dumps({'name': 'pcie-ep8', 'port': 30000})}\n[Unit]\n"
    assert snapshot.profile_from_unit(unit) == {"name": "pcie-ep8", "port": 30000}
    assert snapshot.profile_from_unit("[Unit]\nDescription=hand-written\n") is None


def test_a_root_or_out_that_is_not_a_folder_is_one_line_and_writes_nothing(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x\n")
    for args, expected in (
        (("--root", str(tmp_path / "typo")), f"--root {tmp_path / 'typo'} is not a directory"),
        (("--root", str(a_file)), f"--root {a_file} is not a directory"),
        (("--out", str(a_file / "snap")), f"cannot create {a_file / 'snap'}"),
    ):
        result = run_cli("snapshot", *args, path=cpu_path())
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("k26-deploy: error: ") and expected in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
