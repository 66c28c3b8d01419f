"""fetch-model end to end: the real aria2c against a fake hub on 127.0.0.1."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fetch_support import REPO_ROOT, TOKEN, cli_argv, cli_env, model_files, needs_aria2c, run_cli
from fakehub import FakeFile

from k26_ddtree.fetch.modeldir import model_dir_problem

pytestmark = needs_aria2c


class Aria2cWatcher:
    """Records the argv and environment of every aria2c child of one k26-deploy process."""

    def __init__(self, parent_pid: int):
        self.marker = f"--stop-with-process={parent_pid}".encode()
        self.seen: dict[int, tuple[bytes, bytes]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for pid in self.live_pids():
                if pid not in self.seen:
                    try:
                        self.seen[pid] = (Path(f"/proc/{pid}/cmdline").read_bytes(),
                                          Path(f"/proc/{pid}/environ").read_bytes())
                    except OSError:
                        pass
            time.sleep(0.05)

    def live_pids(self) -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if self.marker in cmdline and b"aria2c" in cmdline.split(b"\0")[0]:
                pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def assert_no_token_anywhere(result_text: str, dest: Path) -> None:
    assert TOKEN not in result_text
    for path in dest.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def assert_matches_repo(dest: Path, files: dict[str, FakeFile]) -> None:
    for name, file in files.items():
        assert (dest / name).read_bytes() == file.data, name
    check = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=dest,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert model_dir_problem(dest) is None
    assert not (dest / ".partial").exists()


def test_parallel_download_verifies_records_and_never_leaks_the_token(hub, tmp_path):
    files = model_files(shards=4)
    commit = hub.add_repo("org/kimi", files)
    hub.chunk_delay_s = 0.01  # responses overlap, so parallel files are observable
    dest = tmp_path / "kimi"
    proc = subprocess.Popen(
        cli_argv("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url,
                 "--parallel-files", "3", "--connections", "4"),
        cwd=REPO_ROOT, env=cli_env(HF_TOKEN=TOKEN), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    watcher = Aria2cWatcher(proc.pid)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        watcher.stop()
    assert proc.returncode == 0, out + err
    assert_matches_repo(dest, files)
    assert_no_token_anywhere(out + err, dest)
    assert watcher.seen, "aria2c was never seen running"
    for cmdline, environ in watcher.seen.values():
        assert TOKEN.encode() not in cmdline
        assert TOKEN.encode() not in environ
    assert hub.max_active >= 2, "files were not downloaded in parallel"
    assert all(seen.authorized for seen in hub.requests if not seen.path.startswith("/cdn/"))
    for name in files:
        assert f"ok      {name}" in out
    assert "downloaded " in out and "average" in out
    stamp = json.loads((dest / ".k26-model.json").read_text())
    assert stamp["repo"] == "org/kimi" and stamp["commit"] == commit and stamp["complete"]
    assert stamp["verified_at"]
    assert {f["path"]: f["size"] for f in stamp["files"]} == {n: len(f.data) for n, f in files.items()}


def test_rerun_skips_verified_files_and_checks_files_put_there_by_hand(hub, tmp_path):
    files = model_files(shards=2)
    hub.add_repo("org/kimi", files)
    dest = tmp_path / "kimi"
    assert run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url).returncode == 0
    downloads = len([s for s in hub.requests if "/resolve/" in s.path])

    again = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to do" in again.stdout
    assert len([s for s in hub.requests if "/resolve/" in s.path]) == downloads

    # Without the stamp, the files present are hashed rather than downloaded again.
    (dest / ".k26-model.json").unlink()
    (dest / "SHA256SUMS").unlink()
    third = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    assert third.returncode == 0, third.stdout + third.stderr
    assert third.stdout.count("ok (present)") == len(files)
    assert len([s for s in hub.requests if "/resolve/" in s.path]) == downloads
    assert_matches_repo(dest, files)


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _interrupted_then_resumed(hub, tmp_path, sig: int, connections: int) -> None:
    files = model_files(shards=2, shard_size=6 << 20)
    hub.add_repo("org/kimi", files)
    big = "model-00001-of-00002.safetensors"
    hub.chunk_delay_s = 0.1  # ~640 KiB/s per connection: still running when it is killed
    dest = tmp_path / "kimi"
    args = ("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url,
            "--connections", str(connections), "--min-split-size", "1M")
    proc = subprocess.Popen(cli_argv(*args), cwd=REPO_ROOT, env=cli_env(HF_TOKEN=TOKEN),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = Aria2cWatcher(proc.pid)
    try:
        _wait_for(lambda: hub.bytes_sent.get(big, 0) >= 1 << 20, 60, "the first MiB")
        os.kill(proc.pid, sig)
        proc.communicate(timeout=60)
        # aria2c stops on its own when k26-deploy is gone (--stop-with-process), saving its state.
        _wait_for(lambda: not watcher.live_pids(), 60, "aria2c to stop")
    finally:
        watcher.stop()
        if proc.poll() is None:
            proc.kill()
    assert not (dest / big).exists(), "an unfinished file counted as done"
    assert model_dir_problem(dest) is not None
    partial = dest / ".partial" / f"{big}.{files[big].sha256[:16]}"
    assert partial.is_file() and partial.with_name(partial.name + ".aria2").is_file()
    assert_no_token_anywhere("", dest)  # resume records, hooks, events: none holds the token
    first_requests = len(hub.requests)
    if connections > 1:
        assert len(set(hub.range_starts(files[big].sha256))) >= 2, "the file was not split"

    hub.chunk_delay_s = 0.0
    resumed = run_cli(*args)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # aria2c opens with a plain GET to learn the length, then asks only for what it lacks.
    starts = hub.range_starts(files[big].sha256, since=first_requests)
    assert starts and min(starts) > 0, f"the second run did not resume: {starts}"
    assert_matches_repo(dest, files)


def test_resume_after_the_fetch_is_killed(hub, tmp_path):
    _interrupted_then_resumed(hub, tmp_path, signal.SIGKILL, connections=1)


def test_resume_of_a_split_download_after_the_fetch_is_terminated(hub, tmp_path):
    _interrupted_then_resumed(hub, tmp_path, signal.SIGTERM, connections=4)


def test_a_shard_served_wrong_once_is_detected_and_fetched_again(hub, tmp_path):
    files = model_files(shards=3)
    hub.add_repo("org/kimi", files)
    bad = "model-00002-of-00003.safetensors"
    hub.corrupt[bad] = 1
    dest = tmp_path / "kimi"
    result = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"BAD     {bad}" in result.stdout and "downloading it again" in result.stdout
    assert hub.corrupt[bad] == 0
    assert_matches_repo(dest, files)


def test_a_persistently_wrong_file_is_reported_with_exit_1(hub, tmp_path):
    files = model_files(shards=2)
    hub.add_repo("org/kimi", files)
    bad_lfs, bad_small = "model-00001-of-00002.safetensors", "config.json"
    hub.corrupt[bad_lfs] = -1
    hub.corrupt[bad_small] = -1
    dest = tmp_path / "kimi"
    result = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "k26-deploy: error: 2 files not fetched and verified" in result.stderr
    assert f"org/kimi:{bad_lfs}" in result.stderr and f"org/kimi:{bad_small}" in result.stderr
    assert "sha256" in result.stdout and "git blob id" in result.stdout
    assert not (dest / bad_lfs).exists() and not (dest / bad_small).exists()
    assert not (dest / "SHA256SUMS").exists()
    assert (dest / "model-00002-of-00002.safetensors").read_bytes() == files["model-00002-of-00002.safetensors"].data
    assert "is not verified" in model_dir_problem(dest) or "SHA256SUMS" in model_dir_problem(dest)


def test_a_finished_but_unverified_partial_is_verified_not_downloaded(hub, tmp_path):
    files = model_files(shards=1)
    hub.add_repo("org/kimi", files)
    dest = tmp_path / "kimi"
    name = "model-00001-of-00001.safetensors"
    (dest / ".partial").mkdir(parents=True)
    (dest / ".partial" / f"{name}.{files[name].sha256[:16]}").write_bytes(files[name].data)
    result = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not [s for s in hub.requests if s.path.startswith("/cdn/")]
    assert_matches_repo(dest, files)


def test_the_fields_drafter_comes_along_by_default_into_dest_dflash(hub, tmp_path):
    model, drafter = model_files(shards=2), model_files(shards=1, shard_size=1 << 20)
    hub.add_repo("org/kimi", model)
    hub.add_repo("SubSir/Kimi-K2.6-DFlash-tmp-long", drafter)
    dest = tmp_path / "models" / "Kimi-K2.6"
    result = run_cli("fetch-model", "--model", "org/kimi", "--dest", str(dest), "--endpoint", hub.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_matches_repo(dest, model)
    # Where the shipped profiles look for it: /models/Kimi-K2.6 pairs with /models/Kimi-K2.6-DFlash.
    assert_matches_repo(tmp_path / "models" / "Kimi-K2.6-DFlash", drafter)
    assert f"ready: {tmp_path / 'models' / 'Kimi-K2.6-DFlash'}" in result.stdout
    stamp = json.loads((tmp_path / "models" / "Kimi-K2.6-DFlash" / ".k26-model.json").read_text())
    assert stamp["repo"] == "SubSir/Kimi-K2.6-DFlash-tmp-long"


def test_another_drafter_or_none_can_be_chosen(hub, tmp_path):
    hub.add_repo("org/kimi", model_files(shards=1, shard_size=1 << 20))
    hub.add_repo("lab/other-dflash", model_files(shards=1, shard_size=1 << 20))
    other = run_cli("fetch-model", "--model", "org/kimi", "--dest", str(tmp_path / "a" / "kimi"),
                    "--drafter", "lab/other-dflash", "--endpoint", hub.url)
    assert other.returncode == 0, other.stdout + other.stderr
    assert json.loads((tmp_path / "a" / "kimi-DFlash" / ".k26-model.json").read_text())["repo"] == "lab/other-dflash"
    alone = run_cli("fetch-model", "--model", "org/kimi", "--dest", str(tmp_path / "b" / "kimi"), "--no-drafter",
                    "--endpoint", hub.url)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["kimi"]
    both = run_cli("fetch-model", "--dest", str(tmp_path / "c"), "--no-drafter", "--drafter-dest", str(tmp_path / "d"))
    assert both.returncode == 2 and "--drafter-dest and --no-drafter contradict" in both.stderr


def test_token_file_must_be_private_and_is_used(hub, tmp_path):
    hub.add_repo("org/kimi", model_files(shards=1, shard_size=1 << 20))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)
    dest = tmp_path / "kimi"
    args = ("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url,
            "--token-file", str(token_file))
    refused = run_cli(*args, env=cli_env())
    assert refused.returncode == 2
    assert "chmod 600" in refused.stderr and TOKEN not in refused.stderr + refused.stdout
    assert not hub.requests

    token_file.chmod(0o600)
    accepted = run_cli(*args, env=cli_env())
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert_no_token_anywhere(accepted.stdout + accepted.stderr, dest)


def test_without_a_token_the_gated_repo_is_refused_with_a_hint(hub, tmp_path):
    hub.add_repo("org/kimi", model_files(shards=1, shard_size=1 << 20))
    result = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(tmp_path / "kimi"),
                     "--endpoint", hub.url, env=cli_env())
    assert result.returncode == 2
    assert "HTTP 401" in result.stderr and "HF_TOKEN" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_repository_and_bad_flags_are_one_line_errors(hub, tmp_path):
    missing = run_cli("fetch-model", "--model", "org/none", "--dest", str(tmp_path / "x"), "--endpoint", hub.url)
    assert missing.returncode == 2 and "was not found" in missing.stderr
    too_many = run_cli("fetch-model", "--dest", str(tmp_path / "x"), "--connections", "32", "--endpoint", hub.url)
    assert too_many.returncode == 2 and "between 1 and 16" in too_many.stderr
    for result in (missing, too_many):
        assert "Traceback" not in result.stderr


def test_sha256sums_lists_the_hash_of_every_file(hub, tmp_path):
    files = model_files(shards=1, shard_size=1 << 20)
    hub.add_repo("org/kimi", files)
    dest = tmp_path / "kimi"
    assert run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url).returncode == 0
    listed = dict(line.split("  ", 1)[::-1] for line in (dest / "SHA256SUMS").read_text().splitlines())
    assert listed == {name: hashlib.sha256(f.data).hexdigest() for name, f in files.items()}


def test_a_second_fetch_into_the_same_directory_is_refused_while_one_runs(hub, tmp_path):
    hub.add_repo("org/kimi", model_files(shards=1, shard_size=1 << 20))
    dest = tmp_path / "kimi"
    (dest / ".partial").mkdir(parents=True)
    with open(dest / ".partial" / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = run_cli("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    assert result.returncode == 2 and "another fetch-model is already filling" in result.stderr
    assert not [s for s in hub.requests if "/resolve/" in s.path]


def test_split_sizes_outside_what_aria2c_takes_are_refused(tmp_path):
    for size in ("512K", "2G", "0", "lots"):
        result = run_cli("fetch-model", "--dest", str(tmp_path / "x"), "--min-split-size", size)
        assert result.returncode == 2 and "from 1M to 1024M" in result.stderr, size


def test_a_mistyped_drafter_fails_before_anything_is_downloaded(hub, tmp_path):
    hub.add_repo("org/kimi", model_files(shards=1, shard_size=1 << 20))
    result = run_cli("fetch-model", "--model", "org/kimi", "--drafter", "lab/typo",
                     "--dest", str(tmp_path / "kimi"), "--endpoint", hub.url)
    assert result.returncode == 2 and "lab/typo at revision 'main' was not found" in result.stderr
    assert not [s for s in hub.requests if "/resolve/" in s.path]


def test_a_partial_of_an_older_version_does_not_spoil_the_new_one(hub, tmp_path):
    old = model_files(shards=1, shard_size=4 << 20)
    hub.add_repo("org/kimi", old)
    name = "model-00001-of-00001.safetensors"
    hub.chunk_delay_s = 0.1
    dest = tmp_path / "kimi"
    args = ("fetch-model", "--model", "org/kimi", "--no-drafter", "--dest", str(dest), "--endpoint", hub.url)
    proc = subprocess.Popen(cli_argv(*args), cwd=REPO_ROOT, env=cli_env(HF_TOKEN=TOKEN),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: hub.bytes_sent.get(name, 0) >= 512 << 10, 60, "the first bytes")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()

    new = dict(old, **{name: FakeFile(b"new weights " * 300_000, lfs=True)})
    hub.add_repo("org/kimi", new)  # the branch moved: same path, other content, new commit
    hub.chunk_delay_s = 0.0
    result = run_cli(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_matches_repo(dest, new)


@pytest.mark.parametrize("args, expected", [
    (("--endpoint", "notaurl"), "hub endpoint 'notaurl' must be an http(s) URL"),
    (("--endpoint", "http://[::1"), "hub endpoint 'http://[::1' is not a valid URL"),
    (("--dest", "{file}"), "exists and is not a directory"),
    (("--drafter", "lab/drafter", "--drafter-dest", "{file}"), "exists and is not a directory"),
])
def test_a_bad_endpoint_or_a_file_as_destination_fails_before_any_request(tmp_path, args, expected):
    (tmp_path / "file").write_text("not a directory\n")
    argv = ["fetch-model", "--dest", str(tmp_path / "x"), *(a.replace("{file}", str(tmp_path / "file")) for a in args)]
    result = run_cli(*argv, env=cli_env(HF_TOKEN=TOKEN, HF_ENDPOINT="http://127.0.0.1:9"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and expected in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"], "nothing created"


def test_a_token_file_that_is_not_text_is_a_one_line_error(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_bytes(b"\xff\xfe")
    token_file.chmod(0o600)
    result = run_cli("fetch-model", "--dest", str(tmp_path / "x"), "--token-file", str(token_file),
                     "--endpoint", "http://127.0.0.1:9", env=cli_env())
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"k26-deploy: error: token file {token_file} is not text (not UTF-8)"
