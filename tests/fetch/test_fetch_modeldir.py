"""verify-model and model_dir_problem on directories built here (no network, no aria2c needed)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from fetch_support import run_cli

from k26_ddtree.fetch.modeldir import model_dir_problem


@pytest.fixture
def copied_dir(tmp_path):
    """A model directory received by other means: files and a SHA256SUMS from `sha256sum`."""
    model = tmp_path / "k2.6"
    (model / "tokenizer").mkdir(parents=True)
    (model / "model-00001-of-00002.safetensors").write_bytes(b"\x01" * 300_000)
    (model / "model-00002-of-00002.safetensors").write_bytes(b"\x02" * 200_000)
    (model / "config.json").write_text('{"model_type": "kimi_k2"}\n')
    (model / "tokenizer" / "tiktoken.model").write_bytes(b"vocab")
    names = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "tokenizer/tiktoken.model"]
    sums = subprocess.run(["sha256sum", *names], cwd=model, capture_output=True, text=True, check=True)
    (model / "SHA256SUMS").write_text(sums.stdout)
    return model


def test_a_missing_directory_names_the_fetch_command(tmp_path):
    problem = model_dir_problem(tmp_path / "models" / "k2.6")
    assert problem == (f"model directory {tmp_path / 'models' / 'k2.6'} is missing: run "
                       f"`k26-deploy fetch-model --model moonshotai/Kimi-K2.6 --dest {tmp_path / 'models' / 'k2.6'} "
                       "--no-drafter`")
    assert "--model lab/drafter" in model_dir_problem(tmp_path / "d", repo="lab/drafter")
    drafter = tmp_path / "Kimi-K2.6-DFlash"
    assert f"--model SubSir/Kimi-K2.6-DFlash-tmp-long --dest {drafter} --no-drafter`" in model_dir_problem(drafter)


def test_a_directory_without_hashes_is_not_accepted(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    problem = model_dir_problem(tmp_path)
    assert "has no SHA256SUMS" in problem and "k26-deploy fetch-model" in problem


def test_verify_model_accepts_a_copied_directory_and_records_its_stamp(copied_dir):
    problem = model_dir_problem(copied_dir)
    assert "is not verified" in problem and f"k26-deploy verify-model {copied_dir}" in problem
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("  ok       ") == 4
    assert "verified " in result.stdout and "average" in result.stdout
    assert model_dir_problem(copied_dir) is None
    stamp = json.loads((copied_dir / ".k26-model.json").read_text())
    assert stamp["complete"] and stamp["repo"] is None and len(stamp["files"]) == 4


def test_verify_model_names_every_changed_or_missing_file_and_exits_1(copied_dir):
    assert run_cli("verify-model", str(copied_dir)).returncode == 0
    shard = copied_dir / "model-00002-of-00002.safetensors"
    shard.write_bytes(b"\x03" * 200_000)  # same size: only hashing can tell
    (copied_dir / "tokenizer" / "tiktoken.model").unlink()
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 1
    assert "BAD      model-00002-of-00002.safetensors" in result.stdout
    assert "MISSING  tokenizer/tiktoken.model" in result.stdout
    assert ("k26-deploy: error: 2 of 4 files failed verification in "
            f"{copied_dir}: model-00002-of-00002.safetensors, tokenizer/tiktoken.model") in result.stderr
    # The quick check sees the missing file (sizes only, by design it cannot see the changed one).
    assert "lacks tokenizer/tiktoken.model" in model_dir_problem(copied_dir)


def test_a_fifo_where_a_file_belongs_is_named_as_no_file_not_as_missing(copied_dir):
    fifo = copied_dir / "tokenizer" / "tiktoken.model"
    fifo.unlink()
    os.mkfifo(fifo)
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "NOT A FILE  tokenizer/tiktoken.model" in result.stdout and "MISSING" not in result.stdout


def test_the_quick_check_catches_a_truncated_file(copied_dir):
    assert run_cli("verify-model", str(copied_dir)).returncode == 0
    with open(copied_dir / "model-00001-of-00002.safetensors", "r+b") as handle:
        handle.truncate(1000)
    assert "has 1000 bytes, expected 300000" in model_dir_problem(copied_dir)


def test_verify_model_on_a_directory_without_hashes_is_a_user_error(tmp_path):
    result = run_cli("verify-model", str(tmp_path))
    assert result.returncode == 2 and "SHA256SUMS does not exist" in result.stderr
    missing = run_cli("verify-model", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.parametrize("sums, expected", [
    (b"\xff\xfe not text\n", "is not a sha256sum file (not UTF-8 text)"),
    (None, "cannot read"),  # SHA256SUMS is a directory
])
def test_an_unreadable_sha256sums_is_a_one_line_error(copied_dir, sums, expected):
    target = copied_dir / "SHA256SUMS"
    target.unlink()
    if sums is None:
        target.mkdir()
    else:
        target.write_bytes(sums)
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and expected in result.stderr
    assert not (copied_dir / ".k26-model.json").exists()


def test_verify_model_on_a_file_says_it_is_not_a_directory(copied_dir):
    result = run_cli("verify-model", str(copied_dir / "config.json"))
    assert result.returncode == 2 and result.stderr.strip().endswith("config.json is not a directory")


def test_a_link_that_leaves_the_directory_is_refused_one_inside_is_followed(copied_dir, tmp_path):
    outside = tmp_path / "passwd"
    outside.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (copied_dir / "config.json").unlink()
    (copied_dir / "config.json").symlink_to(outside)
    (copied_dir / "tokenizer" / "tiktoken.model").unlink()
    (copied_dir / "tokenizer" / "tiktoken.model").symlink_to("../model-00002-of-00002.safetensors")
    names = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "tokenizer/tiktoken.model"]
    sums = subprocess.run(["sha256sum", *names], cwd=copied_dir, capture_output=True, text=True, check=True)
    (copied_dir / "SHA256SUMS").write_text(sums.stdout)  # the hash of the file the link reaches
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"OUTSIDE  config.json  (a link to {outside}, outside {copied_dir}" in result.stdout
    assert "ok       tokenizer/tiktoken.model" in result.stdout
    assert result.stderr.strip() == (f"k26-deploy: error: 1 of 4 files failed verification in {copied_dir}: "
                                     "config.json")
    assert not (copied_dir / ".k26-model.json").exists()


@pytest.mark.parametrize("tail", ["\n", "# written by hand\n", "\r\n"])
def test_sha256sums_is_read_as_sha256sum_strict_reads_it(copied_dir, tail):
    sums = copied_dir / "SHA256SUMS"
    sums.write_text(sums.read_text().replace("\n", "\r\n" if tail == "\r\n" else "\n") + tail)
    coreutils = subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"], cwd=copied_dir,
                               capture_output=True, text=True)
    assert coreutils.returncode == 0, coreutils.stdout + coreutils.stderr
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verify " in result.stdout and ": 4 files," in result.stdout


def test_a_file_listed_twice_is_an_error_not_two_files(copied_dir):
    sums = copied_dir / "SHA256SUMS"
    first = sums.read_text().splitlines()[0]
    sums.write_text(sums.read_text() + first + "\n")
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert result.stderr.strip() == (f"k26-deploy: error: {sums}:5: config.json listed twice (first on line 1)")
    assert "files," not in result.stdout


def test_a_sha256sums_that_links_out_of_the_directory_is_refused(copied_dir, tmp_path):
    assert run_cli("verify-model", str(copied_dir)).returncode == 0
    stamp = (copied_dir / ".k26-model.json").read_bytes()
    elsewhere = tmp_path / "elsewhere.sums"
    (copied_dir / "SHA256SUMS").rename(elsewhere)
    (copied_dir / "SHA256SUMS").symlink_to(elsewhere)
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert result.stderr.strip() == (f"k26-deploy: error: {copied_dir / 'SHA256SUMS'} is a link to {elsewhere}, "
                                     f"outside {copied_dir}: copy the file in")
    assert (copied_dir / ".k26-model.json").read_bytes() == stamp
    # render/install's quick check refuses it too, though the stamp is complete.
    assert f"{copied_dir / 'SHA256SUMS'} is a link to {elsewhere}" in model_dir_problem(copied_dir)


@pytest.fixture
def read_only():
    """Makes a folder unwritable, even to root (whom permission bits do not stop): by mode 0555
    for other users, by the immutable attribute for root. Undone at the end of the test."""
    made: list = []

    def make(folder) -> None:
        if os.geteuid() != 0:
            folder.chmod(0o555)
            made.append(lambda: folder.chmod(0o755))
            return
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("running as root where `chattr +i` is unavailable: no way to make a folder read-only")
        made.append(lambda: subprocess.run(["chattr", "-i", str(folder)], check=True))

    yield make
    for undo in made:
        undo()


def test_a_read_only_directory_verifies_and_says_the_stamp_was_not_recorded(copied_dir, read_only):
    before = sorted(p.name for p in copied_dir.iterdir())
    read_only(copied_dir)
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("  ok       ") == 4
    assert f"verified, but not recorded: {copied_dir / '.k26-model.json'} cannot be written" in result.stdout
    assert "run verify-model on it where it is writable" in result.stdout
    assert sorted(p.name for p in copied_dir.iterdir()) == before


def test_a_read_only_directory_verified_before_keeps_its_stamp(copied_dir, read_only):
    assert run_cli("verify-model", str(copied_dir)).returncode == 0
    stamp = (copied_dir / ".k26-model.json").read_bytes()
    read_only(copied_dir)
    result = run_cli("verify-model", str(copied_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "its existing stamp already marks the folder verified" in result.stdout
    assert (copied_dir / ".k26-model.json").read_bytes() == stamp
    assert model_dir_problem(copied_dir) is None
