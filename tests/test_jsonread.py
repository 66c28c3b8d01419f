"""The one JSON reader: every way json.loads or the file can fail is one Unreadable naming the JSON."""

from __future__ import annotations

import os

import sys

import pytest

from k26_ddtree import jsonread

DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000


def test_a_file_nested_past_the_recursion_limit_is_too_deep_not_a_recursion_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(DEEP)
    with pytest.raises(jsonread.TooDeep) as raised:
        jsonread.read_json(path)
    assert str(raised.value) == f"{path} nests deeper than the JSON reader goes"


@pytest.mark.parametrize("data", [DEEP, "[" * 10 + "]" * 10], ids=["past-the-recursion-limit", "one-level-over"])
def test_a_bound_refuses_deeper_json_whether_or_not_json_loads_takes_it(data):
    with pytest.raises(jsonread.TooDeep, match="^JSON nested deeper than 9 levels$"):
        jsonread.parse_json(data, "the answer", max_depth=9)
    assert jsonread.parse_json("[" * 9 + "]" * 9, "the answer", max_depth=9) == [[[[[[[[[]]]]]]]]]


@pytest.mark.parametrize("data, message", [
    (b"\xff\xfe{}", "the answer is not UTF-8 text"),
    ("{", "the answer is not JSON (Expecting property name enclosed in double quotes: line 1, column 2)"),
    ("1" * 5000, f"the answer holds an integer of more than {sys.get_int_max_str_digits()} digits"),
])
def test_text_that_is_not_json_is_unreadable_naming_it(data, message):
    with pytest.raises(jsonread.Unreadable) as raised:
        jsonread.parse_json(data, "the answer")
    assert str(raised.value) == message


def test_an_object_naming_a_key_twice_is_unreadable():
    with pytest.raises(jsonread.Unreadable, match="names the key 'spine' twice"):
        jsonread.parse_json('{"spine": true, "spine": false}', "x")


def test_a_file_that_cannot_be_read_is_unreadable_and_a_missing_one_is_the_callers_to_judge(tmp_path):
    with pytest.raises(jsonread.Unreadable, match=r"^pins\.json is not a regular file \(a folder\)$"):
        jsonread.read_json(tmp_path, "pins.json")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(jsonread.Unreadable, match=r"is not a regular file \(a FIFO\)$"):
        jsonread.read_json(fifo)
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(jsonread.Unreadable, match=r"more than the .* MB read at most"):
        jsonread.read_json(big, max_bytes=1000)
    with pytest.raises(FileNotFoundError):
        jsonread.read_json(tmp_path / "missing.json")
