"""Every path flag refuses an empty value (Path("") would be the current folder) and a NUL byte
(which no path holds) as one argparse line, before anything is read or written."""

from __future__ import annotations

import pytest

from k26_ddtree.cli.main import main

FLAGS = [
    ["bench", "--api-key-file", "{v}"],
    ["bench", "report", "{v}"],
    ["fetch-model", "--dest", "kimi", "--token-file", "{v}"],
    ["verify-model", "{v}"],
    ["install", "--profile", "pcie-ep8", "--unit-dir", "{v}"],
    ["setup", "--venv", "{v}"],
    ["snapshot", "--out", "{v}"],
    ["manifest", "--model-dir", "{v}"],
    ["verify", "--manifest", "{v}"],
    ["tune", "--trace", "{v}", "--costs", "sweep.json"],
]


@pytest.mark.parametrize("value, expected", [
    ("", "an empty path names no directory or file; this one is empty: give a path"),
    ("a\0b", "'a\\x00b' holds a NUL byte, which no path can"),
], ids=["empty", "nul"])
@pytest.mark.parametrize("argv", FLAGS, ids=[" ".join(a[:2]) for a in FLAGS])
def test_a_path_flag_refuses_an_empty_value_and_a_nul_byte(capsys, tmp_path, monkeypatch, argv, value, expected):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main([value if a == "{v}" else a for a in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("k26-deploy: error: ") and expected in err[0], err
    assert list(tmp_path.iterdir()) == []
