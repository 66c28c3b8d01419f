"""Profiles: extends/merge, --set, and every user mistake as one line with exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from deploy_helpers import k26, one_line_error

from k26_ddtree.core.budget import max_budget
from k26_ddtree.deploy.profiles import load_profile, shipped_names, with_sets
from k26_ddtree.deploy.schema import Speculative
from k26_ddtree.errors import UserError

RENDER = ("render", "--allow-missing-model", "--no-verify")
PROFILES = Path(__file__).resolve().parents[2] / "deploy" / "profiles"


def test_shipped_profiles_load_and_differ_where_the_hardware_does():
    assert shipped_names() == ["nvlink-tp8-nvls", "pcie-ep4-tp2", "pcie-ep8"]
    ep8, ep4, nvl = (load_profile(n) for n in ("pcie-ep8", "pcie-ep4-tp2", "nvlink-tp8-nvls"))
    assert (ep8.parallel.ep_size, ep8.parallel.moe_a2a_backend) == (8, "none")
    assert (ep4.parallel.tp_size, ep4.parallel.ep_size) == (8, 4)
    assert nvl.parallel.enable_nccl_nvls and nvl.service.fabric_manager
    assert not ep8.service.fabric_manager
    for p in (ep8, ep4, nvl):
        # pcie-ep8 drops the spine: on its emulated box b8/k4 with it served below the chain at C=1
        assert p.speculative == Speculative(algorithm="DDTREE", block_size=8, draft_window_size=2048,
                                            budget=8, topk=4, spine=p is not ep8)
        assert "pcie-ep8-emulated-step-costs" in (PROFILES / f"{p.name}.yaml").read_text(), "each profile says why"
        assert p.host == "127.0.0.1" and p.attention_backend == "triton"
        assert p.python == sys.executable, "python: null means the python running k26-deploy"


def test_user_yaml_extends_a_shipped_name_and_a_path(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: nvlink-tp8-nvls\nport: 31000\nspeculative:\n  budget: 16\nenvironment:\n  A: '1'\n")
    derived = tmp_path / "derived.yaml"
    derived.write_text("extends: ./mine.yaml\nspeculative:\n  topk: 2\nenvironment:\n  B: '2'\n")
    p = load_profile(str(derived))
    assert p.name == "derived"
    assert p.port == 31000 and p.parallel.enable_nccl_nvls
    assert p.speculative.budget == 16 and p.speculative.topk == 2
    assert p.speculative.block_size == 8, "nested mappings merge key by key"
    assert p.environment == {"A": "1", "B": "2"}
    assert [s.rsplit("/", 1)[1] for s in p.sources] == ["base.yaml", "nvlink-tp8-nvls.yaml", "mine.yaml", "derived.yaml"]


def test_set_overrides_are_typed():
    p = load_profile("pcie-ep8", ["speculative.budget=16", "speculative.spine=true", "parallel.ep_size=null",
                                  "router.worker_urls=http://a:1,http://b:2", "environment.FOO=bar baz",
                                  "mem_fraction_static=0.8"])
    assert p.speculative.budget == 16 and p.speculative.spine is True
    assert p.parallel.ep_size is None
    assert p.router.worker_urls == ("http://a:1", "http://b:2")
    assert p.environment["FOO"] == "bar baz" and p.mem_fraction_static == 0.8
    assert with_sets(p, ["speculative.topk=2"]).speculative.topk == 2


def test_budget_range_follows_topk_and_block():
    assert max_budget(7, 4) == sum(4**d for d in range(1, 8)) == 21844
    assert max_budget(7, 1) == 7
    assert load_profile("pcie-ep8", ["speculative.topk=1", "speculative.budget=7"]).speculative.budget == 7
    with pytest.raises(UserError, match=r"larger than the 7 distinct"):
        load_profile("pcie-ep8", ["speculative.topk=1", "speculative.budget=8"])
    with pytest.raises(UserError, match=r"larger than the 6 distinct"):
        load_profile("pcie-ep8", ["speculative.topk=2", "speculative.block_size=3", "speculative.budget=7"])
    # In range, but 21 ranks over 7 levels do not fit the tree builder's 31-bit path codes.
    with pytest.raises(UserError, match=r"speculative.topk 21 is too wide for a tree of 7 levels"):
        load_profile("pcie-ep8", ["speculative.topk=21", "speculative.budget=12"])


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--profile", "pcie-ep9"], "unknown profile 'pcie-ep9'; shipped profiles: nvlink-tp8-nvls, pcie-ep4-tp2, pcie-ep8"),
        (["--profile", "pcie-ep8", "--set", "speculative.budget=0"], "speculative.budget must be >= 1, got 0"),
        (["--profile", "pcie-ep8", "--set", "speculative.topk=0"], "speculative.topk must be >= 1, got 0"),
        (["--profile", "pcie-ep8", "--set", "speculative.budget=21845"], "larger than the 21844 distinct"),
        (["--profile", "pcie-ep8", "--set", "speculative.budget=many"], "must be an integer, got 'many'"),
        (["--profile", "pcie-ep8", "--set", "speculative.bugdet=4"], "unknown key (did you mean speculative.budget?)"),
        (["--profile", "pcie-ep8", "--set", "budget"], "expected KEY=VALUE"),
        (["--profile", "pcie-ep8", "--set", "parallel.ep_size=3"], "parallel.ep_size must divide parallel.tp_size"),
        (["--profile", "pcie-ep8", "--set", "parallel.nnodes=2"], "dist_init_addr is required"),
        (["--profile", "pcie-ep8", "--set", "speculative.algorithm=EAGLE"], "must be one of DDTREE, DFLASH"),
        (["--profile", "pcie-ep8", "--set", "model=models/k2"], "model must be an absolute path"),
        (["--profile", "pcie-ep8", "--set", "port=70000"], "port must be 1..65535"),
        (["--profile", "pcie-ep8", "--set", "host="], "host must be a non-empty string, got ''"),
        (["--profile", "pcie-ep8", "--set", "router.host="], "router.host must be a non-empty string, got ''"),
        (["--profile", "pcie-ep8", "--set", "served_model_name="], "served_model_name must be a non-empty string"),
    ],
)
def test_cli_mistakes_are_one_line_and_exit_2(args, expected):
    assert expected in one_line_error(k26(*RENDER, *args))


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("extends: base\nspeculative:\n  budgett: 4\n", "unknown key 'speculative.budgett' (did you mean 'speculative.budget'?)"),
        ("extends: base\nport: '30000'\n", "port must be an integer, got '30000'"),
        ("extends: base\ncuda_graph: 1\n", "cuda_graph must be true or false, got 1"),
        ("extends: base\nparallel: 8\n", "parallel must be a mapping of keys, got 8"),
        ("extends: base\nextra_args: --foo\n", "extra_args must be a list of strings"),
        ("extends: no-such-profile\n", "unknown profile 'no-such-profile'"),
        ("extends: ./loop.yaml\n", "'extends' forms a cycle (loop.yaml -> loop.yaml)"),
        ("port: 1\n", "missing key"),
        ("extends: base\nport: [1\n", "line "),
        ("- a\n- b\n", "must be a mapping of keys to values, got list"),
        ("extends: base\ndescription: \"two\\nlines\"\n", "must not contain control characters"),
        ("extends: base\nport: 31000\nspeculative: {budget: 4}\nport: 32000\n",
         "line 4: duplicate key 'port' (first at line 2)"),
        ("extends: base\nspeculative:\n  budget: 4\n  topk: 2\n  budget: 16\n",
         "line 5: duplicate key 'budget' (first at line 3)"),
        ("extends: base\nhost: ''\n", "host must be a non-empty string, got ''"),
        ("extends: base\ntool_call_parser: ''\n", "tool_call_parser must be a non-empty string or null"),
    ],
)
def test_yaml_mistakes_are_one_line_and_exit_2(tmp_path, yaml_text, expected):
    path = tmp_path / "loop.yaml"
    path.write_text(yaml_text)
    message = one_line_error(k26(*RENDER, "--profile", str(path)))
    assert expected in message
    assert "loop" in message, "the message names the profile"


@pytest.mark.parametrize(
    "nested",
    [
        "extends: base\nparallel:\n" + "".join("  " * depth + f"k{depth}:\n" for depth in range(1, 1000)),
        "extends: base\nextra_args: " + "[" * 1000 + "]" * 1000 + "\n",
        "extends: base\nenvironment: " + "{a: " * 1000 + "b" + "}" * 1000 + "\n",
    ],
    ids=["block", "flow-list", "flow-map"],
)
def test_a_profile_nested_a_thousand_deep_is_one_line(tmp_path, nested):
    path = tmp_path / "deep.yaml"
    path.write_text(nested)
    message = one_line_error(k26(*RENDER, "--profile", str(path)))
    assert f"profile {path} line " in message and "nested deeper than 32 levels" in message


def test_every_subcommand_reports_profile_mistakes_the_same_way(tmp_path):
    for args in (
        ("render", "--profile", "nope"),
        ("install", "--profile", "nope", "--root", str(tmp_path)),
        ("reconfigure", "--profile", "nope", "--budget", "4", "--dry-run"),
        ("detect", "--profile", "nope"),
    ):
        assert "unknown profile 'nope'" in one_line_error(k26(*args))
    assert "speculative.budget must be >= 1" in one_line_error(k26("reconfigure", "--profile", "pcie-ep8", "--budget", "0"))
    assert "nothing to change" in one_line_error(k26("reconfigure"))


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--budget", "0"], "speculative.budget must be >= 1, got 0"),
        (["--topk", "-1"], "speculative.topk must be >= 1, got -1"),
    ],
)
def test_reconfigure_rejects_a_bad_budget_before_touching_systemd(args, expected):
    assert expected in one_line_error(k26("reconfigure", *args, "--dry-run"))


@pytest.mark.parametrize(
    "args, expected",
    [
        (("render", "--profile", "pcie-ep8", "--allow-missing-model", "--unit", "bad/name"),
         "--unit 'bad/name' is not a systemd unit name"),
        (("install", "--profile", "pcie-ep8", "--allow-missing-model", "--root", "{tmp}", "--unit", "../evil"),
         "--unit '../evil' is not a systemd unit name"),
        (("install", "--profile", "pcie-ep8", "--allow-missing-model", "--root", "{tmp}", "--unit-dir", "rel/dir"),
         "--unit-dir must be an absolute path"),
        (("install", "--profile", "pcie-ep8", "--allow-missing-model", "--root", "{tmp}", "--start"),
         "with --root they would do nothing"),
        (("install", "--profile", "pcie-ep8", "--allow-missing-model", "--root", "{tmp}/a-file"),
         "cannot write {tmp}/a-file/etc/systemd/system/k26-ddtree.service: Not a directory"),
        (("wait-ready", "--url", "notaurl", "--pid", "1", "--timeout", "1"), "must be an http(s) URL with a host"),
        (("wait-ready", "--url", "http://[::1", "--pid", "1", "--timeout", "1"), "is not a valid URL"),
        (("wait-ready", "--url", "http://127.0.0.1:1", "--pid", "1", "--timeout", "nan"),
         "--timeout must be a finite number of seconds >= 0"),
        (("wait-ready", "--url", "http://127.0.0.1:1", "--pid", "1", "--timeout", "-5"),
         "--timeout must be a finite number of seconds >= 0"),
        (("wait-ready", "--url", "http://127.0.0.1:1", "--pid", "0", "--timeout", "1"), "--pid must be a process id >= 1"),
        (("wait-gpu-free", "--timeout", "-1"), "--timeout must be a finite number of seconds >= 0"),
        (("wait-gpu-free", "--max-used-mib", "-5"), "--max-used-mib must be 0 or more"),
    ],
)
def test_unit_path_url_and_wait_mistakes_are_one_line_errors(tmp_path, args, expected):
    (tmp_path / "a-file").write_text("not a directory\n")
    message = one_line_error(k26(*(a.replace("{tmp}", str(tmp_path)) for a in args)))
    assert expected.replace("{tmp}", str(tmp_path)) in message
    assert not (tmp_path / "etc").exists() and not (tmp_path.parent / "evil.service").exists(), "nothing written"


def test_a_profile_that_is_not_text_is_one_line(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe")
    assert "not a YAML text file (not UTF-8)" in one_line_error(k26(*RENDER, "--profile", str(path)))


def test_argparse_mistakes_are_one_line_in_the_same_form():
    message = one_line_error(k26("reconfigure", "--budget", "many"))
    assert message == ("k26-deploy: error: reconfigure: argument --budget: invalid int value: 'many' "
                       "(see `k26-deploy reconfigure --help`)")
    assert "the following arguments are required: --profile" in one_line_error(k26("render"))
    assert "invalid choice: 'rendr'" in one_line_error(k26("rendr"))


def test_a_schedule_replaces_budget_and_topk_in_the_unit():
    proc = k26(*RENDER, "--profile", "pcie-ep8", "--set", "speculative.schedule=1:32/8,4:16/4,16:8/4,64:0")
    assert proc.returncode == 0, proc.stderr
    assert "--speculative-ddtree-budget-schedule 1:32/8,4:16/4,16:8/4,64:0" in proc.stdout
    assert "--speculative-ddtree-budget " not in proc.stdout and "--speculative-ddtree-topk" not in proc.stdout
    profile = with_sets(load_profile("pcie-ep8"), ["speculative.schedule=1:8/4,16:0"])
    assert profile.summary() == "pcie-ep8 (schedule 1:8/4,16:0, block 8, spine off, SGLang 0.5.11)"


@pytest.mark.parametrize(
    "sets, expected",
    [
        (["speculative.schedule=2:8/4"], "speculative.schedule '2:8/4': the first bucket must start at batch size 1"),
        (["speculative.schedule=1:8/4,8:16/4,4:0"], "bucket batch sizes must increase, got 1, 8, 4"),
        (["speculative.schedule=1:8/1"], "bucket 1:8/1: budget 8 is larger than the 7 distinct"),
        (["speculative.schedule=1:8/4,4:16"], "'4:16' is not bs:budget/topk or bs:0"),
        (["speculative.schedule=1:0,8:0"], "every bucket is the chain"),
        (["speculative.schedule=1:8/4" + " " * 5000], "longer than 4096 characters (5005)"),
        (["speculative.schedule=1:8/4", "speculative.algorithm=DFLASH"], "needs speculative.algorithm DDTREE"),
        # int() alone would refuse past 4300 digits in a traceback.
        ([f"speculative.schedule=1:{'9' * 30}/4"], "a number of more than 18 digits"),
        # Other scripts' digits and spaces would reach the unit as typed.
        (["speculative.schedule=\u0661:8/4"], "'\u0661:8/4' is not bs:budget/topk or bs:0"),
        (["speculative.schedule=1:8/4,\u00a04:0"], "is not bs:budget/topk or bs:0"),
    ],
)
def test_bad_schedules_are_one_line_errors(sets, expected):
    args = [word for item in sets for word in ("--set", item)]
    assert expected in one_line_error(k26(*RENDER, "--profile", "pcie-ep8", *args))


def _tune_file(tmp_path, text):
    path = tmp_path / "tuned.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--schedule", "1:8/4,4:"], "--schedule '1:8/4,4:': '4:' is not bs:budget/topk or bs:0"),
        (["--schedule", "1:8/4", "--budget", "8"], "a schedule replaces --budget/--topk"),
        (["--schedule", "1:8/4", "--schedule-file", "x.json"], "give --schedule or --schedule-file, not both"),
        (["--schedule-file", "/nonexistent/tuned.json"], "does not exist (k26-deploy tune writes one)"),
    ],
)
def test_reconfigure_rejects_a_bad_schedule_before_touching_systemd(args, expected):
    assert expected in one_line_error(k26("reconfigure", *args, "--dry-run"))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "is not JSON"),
        ('{"schema": "k26-ddtree-tune/1", "schedule": "1:8/4", "spi', "is not JSON"),
        ('{"schedule": "1:8/4", "spine": true}', "is not a k26-deploy tune schedule file"),
        ('{"schema": "k26-ddtree-tune/1", "schedule": 8, "spine": true}', '"schedule" must be a string'),
        ('{"schema": "k26-ddtree-tune/1", "schedule": "0:8/4", "spine": true}', "must start at batch size 1"),
        ('{"schema": "k26-ddtree-tune/1", "schedule": "1:%s/4", "spine": true}' % ("9" * 30),
         "a number of more than 18 digits"),
    ],
)
def test_reconfigure_rejects_a_bad_schedule_file_in_one_line(tmp_path, text, expected):
    assert expected in one_line_error(k26("reconfigure", "--schedule-file", _tune_file(tmp_path, text), "--dry-run"))


def test_schedule_file_of_chains_only_serves_dflash(tmp_path):
    from k26_ddtree.tune import schedule_file

    path = _tune_file(tmp_path, '{"schema": "k26-ddtree-tune/1", "schedule": "1:0", "spine": false}')
    assert schedule_file.read(Path(path)) == schedule_file.ScheduleFile(None, False)
