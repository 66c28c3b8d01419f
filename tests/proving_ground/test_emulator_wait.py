"""The device-side wait: equal to the cost model, computed without any device-to-host read."""

from __future__ import annotations

import inspect
import random
from types import SimpleNamespace

import pytest
import torch

from proving_ground.emulator import wait
from proving_ground.emulator.calibration import box_names, load


class NoSync(torch.Tensor):
    """A tensor whose value cannot reach the host: what a CUDA-graph capture must never need."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.READS:
            raise AssertionError(f"{func.__name__} reads a device value on the host")
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("name", box_names())
@pytest.mark.parametrize("mode", ["decode", "target_verify"])
def test_duration_equals_the_model(name, mode):
    costs = load(name)
    rng = random.Random(0)
    for batch in (1, 3, 16, 128):
        tokens = 1 if mode == "decode" else rng.choice([8, 9, 17, 33])
        lens = [rng.randint(1, 8192) for _ in range(batch)]
        for dtype in (torch.int32, torch.int64):
            got = wait.wait_ns(costs, mode, tokens * batch, batch, torch.tensor(lens, dtype=dtype))
            assert got.dtype == torch.int64 and got.shape == ()
            expected = costs.step_us(mode, tokens * batch, batch, lens) * 1000
            assert abs(int(got) - expected) <= 1


def test_extend_duration_uses_each_request_s_extend_length():
    costs = load("nvlink-tp8-nvls")
    lens, queries = [300, 1200, 40], [300, 17, 40]
    got = wait.wait_ns(costs, "extend", sum(queries), 3, torch.tensor(lens), torch.tensor(queries))
    assert abs(int(got) - costs.step_us("extend", sum(queries), 3, lens, queries) * 1000) <= 1


def test_subtract_lowers_the_wait_and_it_never_goes_negative():
    costs = load("pcie-tp8")
    lens = torch.tensor([2048])
    full = int(wait.wait_ns(costs, "decode", 1, 1, lens))
    assert int(wait.wait_ns(costs, "decode", 1, 1, lens, subtract_us=1000.0)) == full - 1_000_000
    assert int(wait.wait_ns(costs, "decode", 1, 1, lens, subtract_us=1e9)) == 0


def _mode(name: str) -> SimpleNamespace:
    return SimpleNamespace(is_idle=lambda: name == "idle", is_decode=lambda: name == "decode",
                           is_target_verify=lambda: name == "target_verify")


@pytest.mark.parametrize("mode", ["decode", "target_verify", "extend"])
def test_step_wait_never_reads_the_device(mode):
    costs = load("pcie-ep8")
    seq_lens = torch.tensor([100, 2000, 7]).as_subclass(NoSync)
    extend = torch.tensor([100, 1, 7]).as_subclass(NoSync)
    tokens = {"decode": 3, "target_verify": 27, "extend": 108}[mode]
    batch = SimpleNamespace(forward_mode=_mode(mode), batch_size=3, seq_lens=seq_lens, extend_seq_lens=extend)
    got = wait.step_wait(costs, {"decode": 0.0, "target_verify": 0.0, "extend": 0.0}, batch, tokens)
    queries = [100, 1, 7] if mode == "extend" else None
    expected = costs.step_us(mode, tokens, 3, [100, 2000, 7], queries) * 1000
    assert abs(int(got.as_subclass(torch.Tensor)) - expected) <= 1


def test_step_wait_skips_an_empty_batch():
    batch = SimpleNamespace(forward_mode=_mode("idle"), batch_size=0, seq_lens=torch.zeros(0, dtype=torch.int64),
                            extend_seq_lens=None)
    assert wait.step_wait(load("pcie-tp8"), {}, batch, 0) is None


def test_no_host_reads_in_the_source():
    for fn in (wait.wait_ns, wait.spin, wait.step_wait):
        src = inspect.getsource(fn)
        for read in (".item(", ".tolist(", ".cpu(", ".numpy(", "int(", "float(", "bool("):
            assert read not in src, (fn.__name__, read)


def test_spin_on_the_cpu_returns_without_spinning():
    assert int(wait.spin(torch.tensor(10**12))) == 0


def test_device_check_refuses_bad_input_and_a_missing_gpu_in_one_line():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "proving_ground" / "device" / "emulator_check.py"
    for args in (["--box", "nope"], []):
        done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
