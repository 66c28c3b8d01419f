"""`k26-deploy manifest` / `verify` on a copy of this repository's reproduction package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from k26_ddtree.repro import manifest
from repro_helpers import REPO, run_cli


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the covered folders of this checkout, plus a REPRODUCE.md and a drafter-less env."""
    root = tmp_path / "repro"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in manifest.COVERED_DIRS:
        if (REPO / folder).is_dir():
            shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    for name in manifest.COVERED_FILES:
        if (REPO / name).is_file():
            shutil.copyfile(REPO / name, root / name)
    # Make sure every covered kind of file exists even while other parts of the repo are being written.
    (root / "REPRODUCE.md").write_text((root / "REPRODUCE.md").read_text() if (root / "REPRODUCE.md").exists()
                                       else "# Reproduce\n")
    results = root / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "run-1.json").write_text('{"tok_s": 150.0}\n')
    (root / "patches" / "sglang-0.5.11").mkdir(parents=True, exist_ok=True)
    (root / "patches" / "sglang-0.5.11" / "series").write_text("srt/server_args.py.diff\n")
    (root / "not-covered.txt").write_text("outside the package\n")
    return root


def _manifest(root: Path, *extra: str):
    return run_cli("manifest", "--root", str(root), *extra)


def _verify(root: Path):
    return run_cli("verify", "--root", str(root))


def test_fresh_manifest_passes_verify_and_sha256sum_strict(tree):
    result = _manifest(tree)
    assert result.returncode == 0, result.stderr
    text = (tree / manifest.MANIFEST_NAME).read_text()
    paths = [line.split("  ", 1)[1] for line in text.splitlines()]
    assert paths == sorted(paths)
    assert "REPRODUCE.md" in paths and "bench/results/run-1.json" in paths
    assert "patches/sglang-0.5.11/series" in paths and "env/setup_env.sh" in paths
    assert "not-covered.txt" not in paths and manifest.MANIFEST_NAME not in paths
    assert not any(path.startswith("/") or "__pycache__" in path for path in paths)

    check = subprocess.run(["sha256sum", "-c", manifest.MANIFEST_NAME, "--strict", "--quiet"], cwd=tree,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr

    verified = _verify(tree)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"verify: OK, {len(paths)} files match" in verified.stdout


def test_manifest_is_deterministic_and_leaves_no_temp_files(tree):
    assert _manifest(tree).returncode == 0
    first = (tree / manifest.MANIFEST_NAME).read_bytes()
    assert _manifest(tree).returncode == 0
    assert (tree / manifest.MANIFEST_NAME).read_bytes() == first
    assert sorted(p.name for p in tree.iterdir() if p.name.startswith(".")) == []


def test_tampered_file_fails_with_exit_1_naming_it(tree):
    assert _manifest(tree).returncode == 0
    target = tree / "env" / "setup_env.sh"
    target.write_text(target.read_text() + "# tampered\n")
    result = _verify(tree)
    assert result.returncode == 1
    assert "changed: env/setup_env.sh" in result.stdout
    assert "1 changed, 0 missing, 0 extra" in result.stderr
    assert "Traceback" not in result.stderr
    check = subprocess.run(["sha256sum", "-c", manifest.MANIFEST_NAME, "--strict", "--quiet"], cwd=tree,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode != 0 and "env/setup_env.sh: FAILED" in check.stdout


def test_missing_and_extra_files_are_reported(tree):
    assert _manifest(tree).returncode == 0
    (tree / "bench" / "results" / "run-1.json").unlink()
    (tree / "bench" / "results" / "run-2.json").write_text("{}\n")
    (tree / "not-covered-either.txt").write_text("ignored: outside the covered folders\n")
    result = _verify(tree)
    assert result.returncode == 1
    assert "missing: bench/results/run-1.json" in result.stdout
    assert "extra: bench/results/run-2.json" in result.stdout
    assert "not-covered-either.txt" not in result.stdout
    assert "0 changed, 1 missing, 1 extra" in result.stderr


def test_absent_or_malformed_manifest_is_a_usage_error(tree):
    result = _verify(tree)
    assert result.returncode == 2 and "not found; write it with `k26-deploy manifest`" in result.stderr
    (tree / manifest.MANIFEST_NAME).write_text("not a checksum line\n")
    result = _verify(tree)
    assert result.returncode == 2 and "MANIFEST.sha256:1: not a sha256sum line" in result.stderr


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing recorded yet\n"])
def test_a_manifest_that_lists_nothing_is_malformed_not_a_list_of_extras(tree, text):
    (tree / manifest.MANIFEST_NAME).write_text(text)
    result = _verify(tree)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "MANIFEST.sha256 lists no files" in _one_line(result)
    assert "extra:" not in result.stdout


def test_drafter_metadata_is_copied_and_recorded(tree, tmp_path):
    drafter = tmp_path / "Kimi-K2.6-DFlash"
    drafter.mkdir()
    (drafter / "SHA256SUMS").write_text("ab" * 32 + "  model.safetensors\n")
    (drafter / ".k26-model.json").write_text('{"repo": "example/drafter", "revision": "abc"}\n')
    (drafter / "model.safetensors").write_bytes(b"\0" * 1024)
    result = _manifest(tree, "--model-dir", str(drafter))
    assert result.returncode == 0, result.stderr
    text = (tree / manifest.MANIFEST_NAME).read_text()
    assert "  env/models/Kimi-K2.6-DFlash/SHA256SUMS\n" in text
    assert "  env/models/Kimi-K2.6-DFlash/.k26-model.json\n" in text
    assert "model.safetensors" not in text
    assert _verify(tree).returncode == 0


def test_model_dir_without_metadata_is_refused(tree, tmp_path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    result = _manifest(tree, "--model-dir", str(empty))
    assert result.returncode == 2 and "has none of SHA256SUMS, .k26-model.json" in result.stderr
    assert not (tree / manifest.MANIFEST_NAME).exists()


def _one_line(result) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("k26-deploy: error: "), result.stderr
    return lines[0]


def test_a_manifest_out_that_cannot_be_written_is_refused_before_anything_is_copied(tree, tmp_path):
    drafter = tmp_path / "Kimi-K2.6-DFlash"
    drafter.mkdir()
    (drafter / "SHA256SUMS").write_text("ab" * 32 + "  model.safetensors\n")
    (tmp_path / "a-file").write_text("x\n")
    assert "is a directory" in _one_line(_manifest(tree, "--out", str(tmp_path), "--model-dir", str(drafter)))
    message = _one_line(_manifest(tree, "--out", str(tmp_path / "a-file" / "M"), "--model-dir", str(drafter)))
    assert f"cannot write {tmp_path / 'a-file' / 'M'}" in message
    assert not (tree / "env" / "models").exists(), "--model-dir copied nothing"


def test_a_binary_manifest_or_a_path_outside_the_root_is_malformed(tree):
    (tree / manifest.MANIFEST_NAME).write_bytes(b"\xff\xfe\n")
    assert "not a sha256sum file (not UTF-8 text)" in _one_line(_verify(tree))
    (tree / manifest.MANIFEST_NAME).write_text("ab" * 32 + "  /etc/passwd\n")
    assert "'/etc/passwd' is not a path inside the root" in _one_line(_verify(tree))
    (tree / manifest.MANIFEST_NAME).write_text("ab" * 32 + "  env/../../outside\n")
    assert "is not a path inside the root" in _one_line(_verify(tree))


def test_a_root_that_does_not_exist_is_named_and_nothing_is_created(tree, tmp_path):
    ghost = tmp_path / "does" / "not" / "exist"
    assert _one_line(_manifest(ghost)) == f"k26-deploy: error: --root {ghost} does not exist"
    assert _one_line(run_cli("verify", "--root", str(ghost), "--manifest", str(tree / "M"))) == (
        f"k26-deploy: error: --root {ghost} does not exist")
    assert _manifest(tree, "--out", str(tree / "M")).returncode == 0
    # A real manifest does not turn a mistyped root into "every file missing".
    assert _one_line(run_cli("verify", "--root", str(ghost), "--manifest", str(tree / "M"))) == (
        f"k26-deploy: error: --root {ghost} does not exist")
    assert not (tmp_path / "does").exists(), "a refused run created folders"
    assert "is not a directory" in _one_line(_manifest(tree / "REPRODUCE.md"))


def test_an_out_in_a_new_folder_is_created_only_when_the_manifest_is_written(tree, tmp_path):
    out = tmp_path / "records" / "today" / "MANIFEST.sha256"
    assert _manifest(tree, "--out", str(out)).returncode == 0
    assert out.is_file() and sorted(p.name for p in out.parent.iterdir()) == ["MANIFEST.sha256"]


@pytest.mark.parametrize("edit, accepted", [
    (lambda text: text + "\n", True),                       # a trailing blank line
    (lambda text: "# recorded by hand\n" + text, True),     # a comment
    (lambda text: text.replace("\n", "\r\n"), True),        # written on Windows
    (lambda text: text + "   \n", False),                   # a line of spaces is no checksum line
])
def test_the_manifest_is_read_as_sha256sum_strict_reads_it(tree, edit, accepted):
    assert _manifest(tree).returncode == 0
    path = tree / manifest.MANIFEST_NAME
    path.write_bytes(edit(path.read_text()).encode())
    coreutils = subprocess.run(["sha256sum", "-c", manifest.MANIFEST_NAME, "--strict", "--quiet"], cwd=tree,
                               capture_output=True, text=True, timeout=120)
    assert (coreutils.returncode == 0) is accepted, coreutils.stdout + coreutils.stderr
    result = _verify(tree)
    if accepted:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert "not a sha256sum line: '   '" in _one_line(result)


def test_a_file_listed_twice_is_refused(tree):
    assert _manifest(tree).returncode == 0
    path = tree / manifest.MANIFEST_NAME
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines + lines[:1]))
    rel = lines[0].split("  ", 1)[1].strip()
    assert _one_line(_verify(tree)).endswith(f":{len(lines) + 1}: {rel} listed twice (first on line 1)")


def test_links_that_leave_the_root_are_never_recorded_or_passed(tree, tmp_path):
    outside = tmp_path / "passwd"
    outside.write_text("root:x:0:0:root:/root:/bin/bash\n")
    inside = tree / "env" / "alias.sh"
    inside.symlink_to("setup_env.sh")  # a link within the root is an ordinary file of the tree
    assert _manifest(tree).returncode == 0
    assert "  env/alias.sh\n" in (tree / manifest.MANIFEST_NAME).read_text()

    victim = tree / "bench" / "results" / "run-1.json"
    victim.unlink()
    victim.symlink_to(outside)
    # sha256sum follows the link; the manifest must not vouch for /etc/passwd as a result file.
    text = (tree / manifest.MANIFEST_NAME).read_text()
    digest = subprocess.run(["sha256sum", str(outside)], capture_output=True, text=True).stdout.split()[0]
    (tree / manifest.MANIFEST_NAME).write_text(
        "".join(f"{digest}  {line.split('  ', 1)[1]}" if line.endswith("  bench/results/run-1.json\n") else line
                for line in text.splitlines(keepends=True)))
    result = _verify(tree)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "outside: bench/results/run-1.json" in result.stdout
    assert "0 changed, 0 missing, 0 extra, 1 outside" in result.stderr and "Traceback" not in result.stderr

    before = (tree / manifest.MANIFEST_NAME).read_bytes()
    message = _one_line(_manifest(tree))
    assert f"bench/results/run-1.json is a link to {outside}, outside {tree}" in message
    assert (tree / manifest.MANIFEST_NAME).read_bytes() == before, "a refused manifest was written"
