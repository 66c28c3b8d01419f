"""The small pieces: listing parser, token sources, aria2c input and argv."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.fetch.aria2 import Aria2Job, Aria2Settings, aria2c_argv, input_text
from k26_ddtree.fetch.hub import parse_snapshot, resolve_url
from k26_ddtree.fetch.token import load_token

COMMIT = "a" * 40
SHA = "b" * 64


def listing(*siblings: dict) -> dict:
    return {"id": "org/m", "sha": COMMIT, "siblings": list(siblings)}


def test_the_listing_yields_lfs_sha256_or_git_blob_id():
    snap = parse_snapshot("org/m", "main", listing(
        {"rfilename": "w.safetensors", "size": 10, "blobId": "c" * 40,
         "lfs": {"sha256": SHA, "size": 10, "pointerSize": 130}},
        {"rfilename": "config.json", "size": 3, "blobId": "d" * 40}))
    assert snap.commit == COMMIT and snap.total_bytes == 13
    config, weights = snap.files
    assert (config.sha256, config.git_oid) == (None, "d" * 40)
    assert (weights.sha256, weights.git_oid) == (SHA, None)


@pytest.mark.parametrize("path", ["../evil", "/etc/passwd", "a/../../b", "SHA256SUMS", ".partial/x",
                                  "new\nline", "back\\slash", "a//b"])
def test_paths_that_would_escape_or_collide_are_refused(path):
    with pytest.raises(ValueError):
        parse_snapshot("org/m", "main", listing({"rfilename": path, "size": 1, "blobId": "d" * 40}))


def test_a_listing_without_hashes_is_refused():
    with pytest.raises(ValueError):
        parse_snapshot("org/m", "main", listing({"rfilename": "x", "size": 1}))
    with pytest.raises(ValueError):
        parse_snapshot("org/m", "main", {"id": "org/m", "siblings": []})


def test_resolve_urls_pin_the_commit_and_quote_the_path():
    assert (resolve_url("http://h/", "org/m", COMMIT, "sub dir/a+b.json")
            == f"http://h/org/m/resolve/{COMMIT}/sub%20dir/a%2Bb.json")


def test_the_environment_wins_then_a_private_file(tmp_path, monkeypatch):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert load_token(None) is None
    file = tmp_path / "token"
    file.write_text("hf_file\n")
    file.chmod(0o600)
    assert load_token(file) == "hf_file"
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_env")
    assert load_token(file) == "hf_env"
    monkeypatch.setenv("HF_TOKEN", "hf_first")
    assert load_token(file) == "hf_first"


def test_token_files_that_others_can_read_or_that_are_missing_are_refused(tmp_path, monkeypatch):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    file = tmp_path / "token"
    file.write_text("hf_x")
    for mode in (0o640, 0o604, 0o660):
        file.chmod(mode)
        with pytest.raises(UserError, match="chmod 600"):
            load_token(file)
    with pytest.raises(UserError, match="does not exist"):
        load_token(tmp_path / "absent")
    monkeypatch.setenv("HF_TOKEN", "two words")
    with pytest.raises(UserError, match="whitespace"):
        load_token(None)


def test_the_token_goes_into_the_input_only_never_into_argv(tmp_path):
    jobs = [Aria2Job("http://h/org/m/resolve/c/a", tmp_path / ".partial" / "sub" / "a")]
    text = input_text(jobs, "hf_secret")
    assert text == (f"http://h/org/m/resolve/c/a\n  dir={tmp_path / '.partial' / 'sub'}\n  out=a\n"
                    "  header=Authorization: Bearer hf_secret\n")
    assert "header=" not in input_text(jobs, None)
    argv = aria2c_argv("/usr/bin/aria2c", Aria2Settings(connections=16, parallel_files=6),
                       {"complete": Path("/h/c"), "error": Path("/h/e")})
    assert "--input-file=-" in argv and "--continue=true" in argv
    assert "--max-connection-per-server=16" in argv and "--split=16" in argv
    assert "--max-concurrent-downloads=6" in argv and f"--stop-with-process={os.getpid()}" in argv
    assert not any("hf_secret" in a or "header" in a for a in argv)
