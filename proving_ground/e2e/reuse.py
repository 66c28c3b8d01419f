"""What lets a later run on the same machine reuse servers, and the oracle file they share."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from k26_ddtree import atomic
from k26_ddtree.processes import alive
from proving_ground import lossless
from proving_ground.e2e.servers import in_parallel, SAFE_ENV, say, stop_group


def site_bundle(site: Path) -> str:
    """The SHA256 of the bundle installed in a site (run.sh records it in .k26-bundle); "" if none."""
    try:
        return (site / ".k26-bundle").read_text().strip()
    except OSError:
        return ""


def patched_site(site: Path, dest: Path, python: str, log: Path) -> tuple[Path | None, str]:
    """A copy of the site at `dest` with the DDTree patch set of its SGLang applied; (None, why)
    when that fails."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(site, dest, symlinks=True)
    env = dict(os.environ, PYTHONPATH=str(dest), **SAFE_ENV)
    proc = subprocess.run([python, "-m", "k26_ddtree", "apply", "--sglang-dir", str(dest / "sglang")],
                          capture_output=True, text=True, env=env, cwd=dest.parent, timeout=300)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return None, f"patch set apply failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-300:]}"
    return dest, "applied"


def write_oracle(path: Path, prompts: list[list[int]], reference: dict, seed: int, rank_policy: str) -> None:
    oracle = {"seed": seed, "rank_policy": rank_policy,
              "prompts": [{"input_ids": prompts[i], "ar_output_ids": reference[i]["output_ids"]}
                          for i in range(len(prompts))]}
    atomic.write_text(path, json.dumps(oracle) + "\n")


def oracle_agreement(carried: Path, reference: dict) -> dict:
    """How far a carried oracle file's AR outputs agree with this run's AR (acceptance only, never correctness)."""
    rows = json.loads(carried.read_text())["prompts"]
    firsts = [lossless.first_divergence(row["ar_output_ids"], reference[i]["output_ids"])
              for i, row in enumerate(rows) if i in reference]
    return {"prompts_identical": sum(f is None for f in firsts),
            "first_divergences": [f for f in firsts if f is not None]}


# Settings that change only how the runner waits for servers, not what a server is.
HARNESS_SETTINGS = ("ready_timeout_s", "launch_stagger_s", "new_tokens", "prompts", "prompt_offset", "reference_concurrency")


def fingerprint(site: Path, models: Path, settings: dict) -> str:
    """What a reused server must share with this run: the installed bundle and the k26_ddtree
    it runs, the model pair and the server settings."""
    served = {k: v for k, v in settings.items() if k not in HARNESS_SETTINGS}
    digest = hashlib.sha256(json.dumps(served, sort_keys=True).encode())
    for path in [site / ".k26-bundle", *sorted((site / "k26_ddtree").rglob("*.py"))]:
        if path.is_file():
            digest.update(str(path.relative_to(site)).encode() + path.read_bytes())
    # The target's config.json carries an emulated box's costs.
    for name in (".k26-model", "train_report.json", "prompts.json", "target/config.json"):
        if (models / name).is_file():
            digest.update((models / name).read_bytes())
    return digest.hexdigest()


def read_state(state: Path, expected: str, bundles: dict[str, str]) -> dict:
    """{name: {"port", "pid", "launched_at", "keep", ...}} of the servers an earlier run kept for
    this code, models and settings, and, for a server of another SGLang version, the bundle now
    installed for it (`bundles`: version -> site_bundle). Every other recorded server is stopped:
    kept for something else, or left behind by a run that was killed, it holds GPU memory and a
    port, and nothing can use it."""
    try:
        recorded = json.loads(state.read_text())
    except (OSError, ValueError):
        return {}
    servers = recorded.get("servers", {})
    usable = recorded.get("fingerprint") == expected

    def why_stale(entry: dict) -> str | None:
        if not usable:
            return "kept by a run of other code, models or settings"
        if not entry.get("keep"):
            return "left by a killed run"
        version = entry.get("sglang")
        if version and bundles.get(version) != entry.get("site_bundle"):
            return f"runs another bundle of sglang {version} than the one installed now"
        return None

    stale = {n: e for n, e in servers.items() if why_stale(e)}
    for name, entry in stale.items():
        say(f"stopping {name} (pid {entry['pid']}): {why_stale(entry)}")
    in_parallel(lambda pid=int(e["pid"]): stop_group(pid, lambda: alive(pid)) for e in stale.values())
    return {n: e for n, e in servers.items() if n not in stale}
