"""Rendered units: content per profile, systemd-analyze verify silent, round trip, install --root."""

from __future__ import annotations

import shutil
import stat

import jinja2
import pytest

from deploy_helpers import directives, exec_start_words, k26, one_line_error

from k26_ddtree.deploy.profiles import load_profile, shipped_names
from k26_ddtree.deploy.units import _render, profile_from_unit, render_router, render_service, validate
from k26_ddtree.errors import UserError

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze not installed (the systemd package)")


@pytest.mark.parametrize("name", shipped_names())
def test_unit_directives(name):
    profile = load_profile(name)
    text = render_service(profile)
    assert directives(text, "Type") == ["exec"]
    assert directives(text, "KillMode") == ["mixed"]
    assert directives(text, "Restart") == ["on-failure"]
    assert directives(text, "LimitMEMLOCK") == ["infinity"]
    assert directives(text, "LimitNOFILE") == ["1048576"]
    assert directives(text, "EnvironmentFile") == ["-/etc/k26-ddtree/k26-ddtree.env"]
    assert int(directives(text, "TimeoutStartSec")[0]) > profile.service.ready_timeout_sec
    assert directives(text, "StartLimitBurst") == ["3"]
    words = exec_start_words(text)
    assert words[:3] == [profile.python, "-m", "sglang.launch_server"]
    assert "--speculative-ddtree-budget" in words and "--trust-remote-code" in words
    post = directives(text, "ExecStartPost")[0]
    assert post.startswith(f"{profile.python} -m k26_ddtree wait-ready --unit k26-ddtree ")
    assert "--url http://127.0.0.1:30000" in post
    assert "wait-gpu-free --timeout 180" in directives(text, "ExecStartPre")[0]
    after = directives(text, "After")[0].split()
    assert "network-online.target" in after
    assert ("nvidia-fabricmanager.service" in after) == name.startswith("nvlink")
    assert ("nvidia-fabricmanager.service" in directives(text, "Wants")[0]) == name.startswith("nvlink")


@needs_analyze
@pytest.mark.parametrize("name", shipped_names())
@pytest.mark.parametrize("sets", [[], ["api_key=true", "environment.NOTE=50% of a \"quoted\" $value",
                                       "extra_args=--chunked-prefill-size,8192", "host=0.0.0.0"]])
def test_systemd_analyze_verify_prints_nothing(name, sets):
    validate(render_service(load_profile(name, sets)), "k26-ddtree")


@needs_analyze
def test_router_unit_verifies_and_lists_the_replicas():
    profile = load_profile("pcie-ep8", ["router.worker_urls=http://10.0.0.1:30000,http://10.0.0.2:30000",
                                        "api_key=true"])
    text = render_router(profile)
    validate(text, "k26-ddtree-router")
    words = exec_start_words(text)
    assert words[1:3] == ["-m", "sglang_router.launch_router"]
    i = words.index("--worker-urls")
    assert words[i + 1:i + 3] == ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]
    assert words[words.index("--policy") + 1] == "cache_aware"


def test_router_without_replicas_is_a_user_error():
    with pytest.raises(UserError, match="router.worker_urls is empty"):
        render_router(load_profile("pcie-ep8"))


@needs_analyze
def test_verify_reports_what_systemd_analyze_says():
    text = render_service(load_profile("pcie-ep8")).replace("KillMode=mixed", "KillMode=mixed\nKillMod=oops")
    with pytest.raises(UserError, match="Unknown key"):
        validate(text, "k26-ddtree")


def test_templates_refuse_undefined_variables():
    with pytest.raises(jinja2.UndefinedError):
        _render("k26-ddtree.service.j2", unit_name="k26-ddtree")


def test_special_characters_reach_the_process_intact():
    text = render_service(load_profile("pcie-ep8", ["environment.NOTE=50% \"q\" $x", "api_key=true"]))
    assert 'Environment="NOTE=50%% \\"q\\" $x"' in text
    assert "--api-key ${K26_API_KEY}" in text, "the key comes from the EnvironmentFile, never the unit"
    assert directives(text, "EnvironmentFile") == ["/etc/k26-ddtree/k26-ddtree.env"], "required with a key"


def test_the_unit_carries_its_profile():
    profile = load_profile("nvlink-tp8-nvls", ["speculative.budget=12"])
    back = profile_from_unit(render_service(profile), "k26-ddtree.service")
    assert back == profile and back.name == "nvlink-tp8-nvls"
    with pytest.raises(UserError, match="not rendered by k26-deploy"):
        profile_from_unit("[Service]\nExecStart=/bin/true\n", "other.service")


def test_render_cli_prints_the_unit_and_refuses_a_missing_model(tmp_path):
    proc = k26("render", "--profile", "pcie-ep8", "--allow-missing-model", "--set", "speculative.budget=16")
    assert proc.returncode == 0, proc.stderr
    assert "--speculative-ddtree-budget 16" in proc.stdout and proc.stdout.startswith("# k26-ddtree.service")
    missing = k26("render", "--profile", "pcie-ep8", "--set", f"model={tmp_path}/no-model")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert f"{tmp_path}/no-model" in missing.stderr and "fetch-model" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_install_under_a_root_writes_the_unit_only(tmp_path):
    proc = k26("install", "--profile", "pcie-ep8", "--root", str(tmp_path), "--allow-missing-model")
    assert proc.returncode == 0, proc.stderr
    unit = tmp_path / "etc/systemd/system/k26-ddtree.service"
    assert profile_from_unit(unit.read_text(), str(unit)).name == "pcie-ep8"
    assert sorted(p.name for p in unit.parent.iterdir()) == ["k26-ddtree.service"], "no temp file left behind"
    assert "no daemon-reload" in proc.stdout


def test_install_checks_the_env_file(tmp_path):
    env = tmp_path / "etc/k26-ddtree/k26-ddtree.env"
    env.parent.mkdir(parents=True)
    env.write_text("K26_API_KEY=sk-1\n")
    env.chmod(0o644)
    args = ("install", "--profile", "pcie-ep8", "--root", str(tmp_path), "--allow-missing-model", "--set", "api_key=true")
    loose = k26(*args)
    assert loose.returncode == 2 and "make it 0600" in loose.stderr
    env.chmod(0o600)
    assert k26(*args).returncode == 0
    env.write_text("OTHER=1\n")
    keyless = k26(*args)
    assert keyless.returncode == 2 and "has no K26_API_KEY" in keyless.stderr
    assert stat.S_IMODE(env.stat().st_mode) == 0o600


def test_help_explains_every_deploy_subcommand():
    for name in ("detect", "render", "install", "reconfigure", "status", "wait-ready", "wait-gpu-free"):
        proc = k26(name, "--help")
        assert proc.returncode == 0 and "usage: k26-deploy " + name in proc.stdout


@pytest.mark.parametrize("make", ["directory", "latin-1"])
def test_install_refuses_an_env_file_it_cannot_read_as_text(tmp_path, make):
    env = tmp_path / "etc/k26-ddtree/k26-ddtree.env"
    env.parent.mkdir(parents=True)
    if make == "directory":
        env.mkdir(mode=0o700)
        expected = f"env_file {env} is not a regular file"
    else:
        env.write_bytes("K26_API_KEY=sk-\xe9t\xe9\n".encode("latin-1"))
        env.chmod(0o600)
        expected = f"env_file {env} is not UTF-8 text"
    proc = k26("install", "--profile", "pcie-ep8", "--root", str(tmp_path), "--allow-missing-model",
               "--set", "api_key=true")
    assert expected in one_line_error(proc)
    assert not (tmp_path / "etc/systemd").exists(), "nothing written"


def test_a_model_path_that_is_a_file_says_so(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 16)
    message = one_line_error(k26("render", "--profile", "pcie-ep8", "--set", f"model={weights}"))
    assert f"model: {weights} is a file, not a model directory" in message
    assert "is missing" not in message


def test_a_profile_turns_the_server_trace_on(tmp_path):
    profile = tmp_path / "traced.yaml"
    profile.write_text("extends: pcie-ep8\nspeculative:\n  trace: /var/lib/k26-ddtree/trace.bin\n  trace_max_mb: 64\n")
    proc = k26("render", "--profile", str(profile), "--allow-missing-model")
    assert proc.returncode == 0, proc.stderr
    words = exec_start_words(proc.stdout)
    assert words[words.index("--speculative-ddtree-trace") + 1] == "/var/lib/k26-ddtree/trace.bin"
    assert words[words.index("--speculative-ddtree-trace-max-mb") + 1] == "64"
    assert profile_from_unit(proc.stdout, "traced.service").speculative.trace == "/var/lib/k26-ddtree/trace.bin"
    off = exec_start_words(k26("render", "--profile", "pcie-ep8", "--allow-missing-model").stdout)
    assert "--speculative-ddtree-trace" not in off, "off by default"
    assert off[off.index("--speculative-ddtree-trace-max-mb") + 1] == "1024", "the cap holds for K26_DDTREE_TRACE too"


@pytest.mark.parametrize("sets, expected", [
    (["speculative.trace=/x/t.bin", "speculative.algorithm=DFLASH"],
     "speculative.trace needs speculative.algorithm DDTREE"),
    (["speculative.trace=trace.bin"], "speculative.trace must be an absolute path"),
    (["speculative.trace_max_mb=0"], "speculative.trace_max_mb must be >= 1, got 0"),
])
def test_trace_mistakes_are_one_line(sets, expected):
    args = ["render", "--profile", "pcie-ep8", "--allow-missing-model"]
    for assignment in sets:
        args += ["--set", assignment]
    assert expected in one_line_error(k26(*args))
