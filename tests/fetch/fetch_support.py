"""Shared by the fetch tests: the token, a model-shaped fake repository, running k26-deploy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakehub import FakeFile, deterministic_bytes

TOKEN = "hf_FakeTokenThatMustNeverLeak0123456789"
REPO_ROOT = Path(__file__).resolve().parents[2]

needs_aria2c = pytest.mark.skipif(
    shutil.which("aria2c") is None,
    reason="aria2c is not installed (apt-get install aria2; .ci/run installs it)")


def model_files(shards: int = 3, shard_size: int = 3 << 20) -> dict[str, FakeFile]:
    """A repository shaped like a real one: LFS shards, small JSON files, one in a subfolder."""
    files = {
        f"model-{i:05d}-of-{shards:05d}.safetensors":
            FakeFile(deterministic_bytes(f"shard-{i}", shard_size + i), lfs=True)
        for i in range(1, shards + 1)
    }
    files["config.json"] = FakeFile(b'{"architectures": ["DeepseekV3ForCausalLM"]}\n', lfs=False)
    files["tokenizer/tokenizer_config.json"] = FakeFile(b'{"model_max_length": 262144}\n', lfs=False)
    files[".gitattributes"] = FakeFile(b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n", lfs=False)
    return files


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_TOKEN_PATH", "HF_HOME")}
    env["HF_HOME"] = "/nonexistent-k26-test-hf-home"  # never pick up a real token file
    env.update(extra)
    return env


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "k26_ddtree", *args]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(cli_argv(*args), cwd=REPO_ROOT, env=env or cli_env(HF_TOKEN=TOKEN),
                          capture_output=True, text=True, timeout=timeout)
