"""One progress display for bench and fetch: tqdm bars on a terminal, plain lines in logs."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios

from k26_ddtree.bench import cells
from k26_ddtree.fetch import fetcher, modeldir
from k26_ddtree.progress import Reporter, TotalMeter


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_one_display_serves_bench_and_fetch():
    assert cells.Reporter is fetcher.Reporter is modeldir.Reporter


def test_a_log_gets_plain_lines_at_the_interval_and_no_carriage_returns():
    log = io.StringIO()
    reporter = Reporter(log, interval_s=0)
    meter = TotalMeter("[1/2] ctx 16 C 1", 4, unit="req")
    for _ in range(3):
        meter.add(1)
        reporter.tick(meter)
    meter.extra = "errors 1"
    meter.add(1)
    reporter.tick(meter)
    reporter.finish(meter, "[1/2] ctx 16 C 1: 99.0 tok/s")
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 5
    assert lines[0].startswith("[1/2] ctx 16 C 1 1 req / 4 req (25%)")
    assert lines[3].endswith("errors 1") and lines[4] == "[1/2] ctx 16 C 1: 99.0 tok/s"
    quiet_interval = io.StringIO()
    slow = Reporter(quiet_interval, interval_s=60)
    for _ in range(10):
        slow.tick(meter)
    assert quiet_interval.getvalue() == ""


def test_a_terminal_gets_a_tqdm_bar_and_whole_lines_above_it():
    screen = Terminal()
    reporter = Reporter(screen)
    meter = TotalMeter("downloaded", 4 << 20)
    meter.add(1 << 20)
    reporter.tick(meter, force=True)
    reporter.line("  ok      model.safetensors")
    meter.add(3 << 20)
    reporter.finish(meter)
    shown = screen.getvalue()
    assert "\r" in shown and "downloaded:" in shown and "%|" in shown and "1.00M/4.00M" in shown
    assert "\n  ok      model.safetensors\n" in "\n" + shown.replace("\r", "\n")
    assert shown.rstrip().endswith("average)")


def test_quiet_prints_nothing():
    log = io.StringIO()
    reporter = Reporter(log, interval_s=0, quiet=True)
    meter = TotalMeter("x", 1, unit="req")
    reporter.line("hello")
    reporter.tick(meter, force=True)
    reporter.finish(meter)
    assert log.getvalue() == ""


def _bench_argv(url, out) -> list[str]:
    return [sys.executable, "-m", "k26_ddtree", "bench", "--url", url, "--out", str(out), "--contexts", "16",
            "--concurrency", "1,2", "--output-len", "8", "--requests", "4", "--warmup", "0"]


def test_bench_progress_in_a_log(standin, tmp_path):
    server = standin()
    done = subprocess.run(_bench_argv(server.url, tmp_path / "log.json"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "\r" not in done.stderr
    assert lines[0] == f"bench: AR at {server.url} -> {tmp_path / 'log.json'}"
    assert lines[1].startswith("[1/2] ctx 16 C 1: ") and "ok 4/4" in lines[1]
    assert lines[2].startswith("[2/2] ctx 16 C 2: ")


def test_bench_progress_on_a_terminal(standin, tmp_path):
    server = standin(env={"STANDIN_TOKENS_PER_S": "200"})
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal has a size
    proc = subprocess.Popen(_bench_argv(server.url, tmp_path / "tty.json"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = shown.decode(errors="replace")
    assert "\r" in text and "req/s" in text and "%|" in text, text
    assert "[1/2] ctx 16 C 1: " in text and "[2/2] ctx 16 C 2: " in text
