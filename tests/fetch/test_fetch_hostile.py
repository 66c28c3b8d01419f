"""fetch-model against hostile input: listings of the wrong shape, a listing larger than the disk,
empty or contradictory flags. Each is one error line, and nothing is created."""

from __future__ import annotations

import json
import subprocess

import pytest
from fetch_support import TOKEN, cli_argv, cli_env, model_files, needs_aria2c, run_cli

COMMIT = "a" * 40


def one_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip()
    assert line.splitlines() == [line], result.stderr
    assert line.startswith("k26-deploy: error: "), line
    return line


def listing(*siblings: object) -> bytes:
    return json.dumps({"id": "org/kimi", "sha": COMMIT, "siblings": list(siblings)}).encode()


@needs_aria2c
@pytest.mark.parametrize("body, expected", [
    (b"[]", "the answer is a JSON list, not an object"),
    (b"null", "the answer is a JSON null, not an object"),
    (b"<html>", "answered something that is not JSON"),
    (json.dumps({"sha": COMMIT, "siblings": ["x"]}).encode(), "a file entry is a JSON string, not an object"),
    (json.dumps({"sha": COMMIT, "siblings": {"a": 1}}).encode(), "siblings is a JSON object, not a list"),
    (json.dumps({"sha": COMMIT, "siblings": None}).encode(), "siblings is a JSON null, not a list"),
    (listing({"rfilename": "a.bin", "size": 5, "lfs": "yes"}), "a.bin: lfs is a JSON string, not an object"),
    (listing({"rfilename": "a.bin", "size": 5, "blobId": ["c" * 40]}), "a.bin: neither an LFS sha256"),
    (listing({"rfilename": "a.bin", "size": True, "blobId": "c" * 40}), "lacks rfilename/size"),
    (listing({"rfilename": "a.bin", "size": 10 ** 30, "blobId": "c" * 40}), "lacks rfilename/size"),
    (listing({"rfilename": "a", "size": 1, "blobId": "c" * 40}, {"rfilename": "a", "size": 1, "blobId": "d" * 40}),
     "'a' is listed twice"),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
])
def test_a_listing_of_the_wrong_shape_is_one_line_naming_the_endpoint(hub, tmp_path, body, expected):
    hub.raw_listings["org/kimi"] = body
    dest = tmp_path / "kimi"
    result = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    # Exit 1, as for the hub's other failures (unreachable, HTTP 5xx): the hub sent it, not the user.
    assert result.returncode == 1, result.stdout + result.stderr
    line = one_line(result)
    assert f"{hub.url}/api/models/org/kimi/revision/main" in line and expected in line
    assert not dest.exists()
    assert not [s for s in hub.requests if "/resolve/" in s.path]


def _huge(path: str) -> bytes:
    # An exbibyte: more than any disk these tests run on has free.
    return listing({"rfilename": path, "size": 1 << 60, "blobId": "c" * 40,
                    "lfs": {"sha256": "b" * 64, "size": 1 << 60, "pointerSize": 134}})


@needs_aria2c
def test_a_download_larger_than_the_free_space_is_refused_before_anything_is_created(hub, tmp_path):
    hub.raw_listings["org/kimi"] = _huge("model.safetensors")
    dest = tmp_path / "models" / "kimi"
    result = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "free but the download needs" in one_line(result)
    assert list(tmp_path.iterdir()) == [], "the refused run left files or folders behind"

    dest.mkdir(parents=True)  # an existing, empty DEST stays empty
    again = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    assert again.returncode == 2 and "free but the download needs" in one_line(again)
    assert list(dest.iterdir()) == []


@needs_aria2c
def test_a_drafter_that_does_not_fit_stops_the_model_download_too(hub, tmp_path):
    hub.add_repo("org/kimi", model_files(shards=1, shard_size=1 << 20))
    hub.raw_listings["lab/huge-dflash"] = _huge("drafter.safetensors")
    dest = tmp_path / "models" / "kimi"
    result = run_cli("fetch-model", "--model", "org/kimi", "--drafter", "lab/huge-dflash", "--dest", str(dest),
                     "--endpoint", hub.url)
    assert result.returncode == 2, result.stdout + result.stderr
    line = one_line(result)
    assert f"{dest} and {tmp_path / 'models' / 'kimi-DFlash'} have" in line and "free but" in line
    assert not [s for s in hub.requests if "/resolve/" in s.path]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, option", [
    (("--dest", ""), "--dest"),
    (("--dest", "kimi", "--drafter-dest", ""), "--drafter-dest"),
])
def test_an_empty_destination_is_refused_not_the_current_folder(hub, tmp_path, args, option):
    hub.add_repo("org/kimi", model_files(shards=1, shard_size=1 << 20))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    extra = () if option == "--drafter-dest" else ("--no-drafter",)
    result = subprocess.run(cli_argv("fetch-model", "--model", "org/kimi", *args, *extra, "--endpoint", hub.url),
                            cwd=cwd, env=cli_env(HF_TOKEN=TOKEN),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"argument {option}: an empty path names no directory" in one_line(result)
    assert list(cwd.iterdir()) == [] and not hub.requests


def test_verify_model_of_an_empty_path_is_refused():
    result = run_cli("verify-model", "")
    assert result.returncode == 2 and "argument DIR: an empty path names no directory" in one_line(result)


@pytest.mark.parametrize("args, expected", [
    (("--no-drafter", "--drafter", "lab/other"), "--drafter and --no-drafter contradict each other"),
    (("--no-drafter", "--drafter-revision", "v2"), "--drafter-revision and --no-drafter contradict each other"),
    (("--no-drafter", "--drafter-dest", "{tmp}/d"), "--drafter-dest and --no-drafter contradict each other"),
    (("--revision", "../evil"), "--revision '../evil' is not a branch, tag or commit"),
    (("--revision", "main~1"), "--revision 'main~1' is not a branch, tag or commit"),
    (("--revision", ".hidden/x"), "--revision '.hidden/x' is not a branch, tag or commit"),
    (("--drafter-revision", "a b"), "--drafter-revision 'a b' is not a branch, tag or commit"),
    (("--revision", ""), "--revision '' is not a branch, tag or commit"),
    (("--parallel-files", "100000"), "--parallel-files must be between 1 and 32"),
    (("--parallel-files", "0"), "--parallel-files must be between 1 and 32"),
])
def test_contradictory_or_unsafe_flags_fail_before_any_request(tmp_path, args, expected):
    argv = ["fetch-model", "--dest", str(tmp_path / "x"), *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    # An endpoint nobody answers on: reaching it would be exit 1 "cannot reach the hub".
    result = run_cli(*argv, env=cli_env(HF_TOKEN=TOKEN, HF_ENDPOINT="http://127.0.0.1:9"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in one_line(result)
    assert list(tmp_path.iterdir()) == []


@needs_aria2c
def test_a_commit_sha_or_a_pr_ref_is_a_revision(hub, tmp_path):
    commit = hub.add_repo("org/kimi", model_files(shards=1, shard_size=1 << 20))
    result = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--revision", commit,
                     "--dest", str(tmp_path / "kimi"), "--endpoint", hub.url)
    assert result.returncode == 0, result.stdout + result.stderr
    pr = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--revision", "refs/pr/1",
                 "--dest", str(tmp_path / "pr"), "--endpoint", hub.url)
    # The fake hub knows no PR: the revision got through to the hub, which said so.
    assert pr.returncode == 2 and "at revision 'refs/pr/1' was not found" in one_line(pr)
