"""`bench report` on input it cannot use: numbers no bench writes, an output folder nobody may
write, runs without a single successful cell. One line with exit 2 (or a clean report), no
warnings, and no folder or file left half-made."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from as_nobody import NobodyTree
from model_server import ModelServer, write_model_folder

from k26_ddtree.cli.main import main

SMALL = ["--contexts", "16,64", "--concurrency", "1,4", "--output-len", "4", "--requests", "2", "--warmup", "0",
         "--quiet"]
NO_TOKENS = b'data: {"text": "", "meta_info": {"completion_tokens": 0, "spec_verify_ct": 0}}\n\ndata: [DONE]\n\n'


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A results file written by `bench run` against a served model."""
    folder = tmp_path_factory.mktemp("served")
    out = folder / "run.json"
    with ModelServer(32000, str(write_model_folder(folder / "model", 32000))) as server:
        assert main(["bench", "--url", server.url, "--out", str(out), *SMALL]) == 0
    return out


def edited(results: Path, folder: Path, edit) -> Path:
    document = json.loads(results.read_text())
    edit(document["runs"][0])
    path = folder / "edited.json"
    path.write_text(json.dumps(document))
    return path


def cell_field(key: str, value):
    def edit(run):
        if "." in key:
            outer, inner = key.split(".")
            run["cells"][1][outer][inner] = value
        else:
            run["cells"][1][key] = value
    return edit


BAD_CELLS = {
    "output_tok_s 1e308": (cell_field("output_tok_s", 1e308), 'cell 2 output_tok_s is 1e+308, not null or a number '
                                                              'in 0..1e+09'),
    "output_tok_s -1": (cell_field("output_tok_s", -1.0), "cell 2 output_tok_s is -1.0, not null or a number"),
    "output_tok_s NaN": (cell_field("output_tok_s", float("nan")), "cell 2 output_tok_s is NaN, not null or a"),
    "concurrency '8'": (cell_field("concurrency", "8"), 'cell 2 concurrency is "8", not an integer in 1..4096'),
    "concurrency 1e30": (cell_field("concurrency", 10 ** 30), "cell 2 concurrency is 1000000000000000000000000000000,"
                                                              " not an integer in 1..4096"),
    "context -1": (cell_field("context", -1), "cell 2 context is -1, not an integer >= 1"),
    "context true": (cell_field("context", True), "cell 2 context is true, not an integer >= 1"),
    "has_errors 'no'": (cell_field("has_errors", "no"), 'cell 2 has_errors is "no", not true or false'),
    "ttft_ms.p99 'x'": (cell_field("ttft_ms.p99", "x"), "cell 2 ttft_ms is {"),
    "request_tok_s list": (cell_field("request_tok_s", [1]), "cell 2 request_tok_s is [1], not an object whose mean, "
                                                             "p50 are each null or a number"),
    "accept_length inf": (cell_field("accept_length", float("inf")), "cell 2 accept_length is Infinity, not null"),
    "label list": (lambda run: run.update(label=["x"]), 'label is ["x"], not a string'),
    "git_sha number": (lambda run: run.update(git_sha=5), "git_sha is 5, not a string or null"),
    "no ok": (lambda run: run["cells"][0].pop("ok"), "has a cell that lacks ok"),
    "eval total 'x'": (lambda run: run.update(coding_eval={"sandbox": "s", "endpoints": {"chat": {
        "passed": 0, "total": "x", "output_tok_s": None, "accept_length": None, "results": []}}}),
        'coding_eval endpoint chat total is "x", not an integer >= 0'),
}


@pytest.mark.parametrize("edit, expected", list(BAD_CELLS.values()), ids=list(BAD_CELLS))
def test_a_number_no_bench_writes_is_one_line_naming_file_and_field(results, tmp_path, capsys, edit, expected):
    path = edited(results, tmp_path, edit)
    out = tmp_path / "report"
    assert main(["bench", "report", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"k26-deploy: error: {path}: run 1 ") and expected in err[0], err
    assert not out.exists(), "no report folder for input it refused"


def test_the_bench_refuses_to_append_to_a_file_it_could_not_report(results, tmp_path, capsys):
    path = edited(results, tmp_path, cell_field("output_tok_s", 1e308))
    before = path.read_bytes()
    with ModelServer(32000, str(write_model_folder(tmp_path / "model", 32000))) as server:
        assert main(["bench", "--url", server.url, "--out", str(path), *SMALL]) == 2
    assert "cell 2 output_tok_s is 1e+308" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_a_failed_report_removes_the_folders_it_created(results, tmp_path, monkeypatch, capsys):
    from k26_ddtree.bench import plots

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plots, "write_plots", full_disk)
    out = tmp_path / "new" / "report"
    assert main(["bench", "report", str(results), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"k26-deploy: error: cannot write the plots into {out}: No space left on device\n"
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("kept\n")
    assert main(["bench", "report", str(results), "--out", str(existing)]) == 2
    assert [p.name for p in existing.iterdir()] == ["keep.txt"], "a folder it did not create is left as it was"


def test_a_read_only_out_folder_is_one_line(results):
    """Root writes into read-only folders; the refusal is only seen as another user."""
    nobody = NobodyTree(["k26_ddtree.bench.report", "k26_ddtree.bench.plots", "matplotlib.pyplot"])
    try:
        source = nobody.root / "run.json"
        shutil.copy(results, source)
        source.chmod(0o644)
        mpl = nobody.scratch("mpl")
        read_only = nobody.scratch("rodir", 0o555)
        done = nobody.run(["-m", "k26_ddtree", "bench", "report", str(source), "--out", str(read_only)],
                          timeout=120, env={"MPLCONFIGDIR": str(mpl)})
        assert done.returncode == 2, done.stderr
        assert done.stderr == f"k26-deploy: error: cannot write the plots into {read_only}: Permission denied\n"
        assert list(read_only.iterdir()) == []
    finally:
        nobody.remove()


def test_a_report_of_runs_without_a_successful_cell_warns_nothing(tmp_path):
    folder = write_model_folder(tmp_path / "model", 32000)
    results = tmp_path / "zero.json"
    with ModelServer(32000, str(folder), bodies={"/generate": NO_TOKENS}) as server:
        assert main(["bench", "--url", server.url, "--out", str(results), *SMALL]) == 1
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "k26_ddtree", "bench", "report", str(results), "--out", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split() == [str(out / name) for name in ("report.md", "throughput.png", "single_stream.png")]


def test_plots_are_readable_like_the_report(results, tmp_path):
    out = tmp_path / "report"
    assert main(["bench", "report", str(results), "--out", str(out)]) == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert set(modes.values()) == {0o644}, modes
