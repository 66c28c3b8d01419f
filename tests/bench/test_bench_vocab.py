"""The bench never sends a token id the served model lacks (one such id took SGLang down)."""

from __future__ import annotations

import json

import pytest
from model_server import ModelServer, write_model_folder

from k26_ddtree.cli.main import main

SPECIAL = (1, 2, *range(2040, 2048))
SMALL = ["--contexts", "1500", "--concurrency", "1", "--output-len", "4", "--requests", "2", "--warmup", "1",
         "--quiet"]


def bench(server: ModelServer, out, *args: str) -> int:
    return main(["bench", "--url", server.url, "--out", str(out), *SMALL, *args])


@pytest.mark.parametrize("nested", [False, True], ids=["config", "kimi-text-config"])
def test_the_default_range_stays_inside_a_small_vocabulary(tmp_path, nested):
    folder = write_model_folder(tmp_path / "model", 2048, SPECIAL, nested=nested)
    with ModelServer(2048, str(folder), SPECIAL) as server:
        assert bench(server, tmp_path / "run.json") == 0
    assert server.generate_calls == 3 and not server.dead
    assert server.out_of_vocabulary == [] and server.specials_sent == []
    # 1500 ids from a 1040-id range wrap around it: its whole top is used, nothing past it.
    assert server.ids_seen == set(range(1000, 2040))
    prompts = json.loads((tmp_path / "run.json").read_text())["runs"][0]["settings"]["prompts"]
    assert prompts["id_range"] == [1000, 2040]
    assert prompts["vocabulary"] == {"size": 2048, "source": str(folder / "config.json"), "special_ids": len(SPECIAL)}


def test_a_range_past_the_vocabulary_is_refused_before_any_request(tmp_path, capsys):
    folder = write_model_folder(tmp_path / "model", 2048)
    with ModelServer(2048, str(folder)) as server:
        assert bench(server, tmp_path / "run.json", "--id-range", "1000:30000") == 2
        assert bench(server, tmp_path / "run.json", "--vocab-size", "4096") == 2
    assert server.generate_calls == 0 and not (tmp_path / "run.json").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"k26-deploy: error: --id-range 1000:30000 reaches past the served model's 2048 token ids "
        f"({folder / 'config.json'}): use HIGH <= 2048",
        f"k26-deploy: error: --vocab-size 4096 is more than the 2048 ids that {folder / 'config.json'} gives "
        f"the served model",
    ]


def test_an_unknown_vocabulary_is_refused_unless_the_user_names_it(tmp_path, capsys):
    with ModelServer(2048, "/models/not-on-this-machine") as server:
        assert bench(server, tmp_path / "run.json") == 2
        assert server.generate_calls == 0 and not (tmp_path / "run.json").exists()
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot tell how many token ids the model" in err[0]
        assert "'/models/not-on-this-machine' is not a folder on this machine" in err[0] and "--vocab-size N" in err[0]
        assert bench(server, tmp_path / "run.json", "--vocab-size", "2048") == 0
    assert server.out_of_vocabulary == [] and server.generate_calls == 3


def test_text_prompts_need_no_vocabulary(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("alpha beta gamma delta " * 50)
    with ModelServer(2048, "/models/not-on-this-machine") as server:
        assert bench(server, tmp_path / "run.json", "--prompt-file", str(corpus)) == 0
    assert server.generate_calls == 3 and server.ids_seen == set()


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json"])
def test_a_model_file_nested_too_deep_is_one_line_naming_it(tmp_path, capsys, name):
    folder = write_model_folder(tmp_path / "model", 2048)
    (folder / name).write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    with ModelServer(2048, str(folder)) as server:
        assert bench(server, tmp_path / "run.json") == 2
    assert server.generate_calls == 0 and not (tmp_path / "run.json").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"k26-deploy: error: {folder / name} nests deeper than the JSON reader goes: "
                   "it is read to learn the served model's vocabulary"]
