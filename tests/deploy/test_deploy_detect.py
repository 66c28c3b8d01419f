"""detect and wait-gpu-free with a fake nvidia-smi on PATH (real outputs' shape), and with none."""

from __future__ import annotations

import json
import os
import sys

import pytest

from deploy_helpers import k26

from k26_ddtree.deploy.nvidia import nvlink_links

B300 = "NVIDIA B300 SXM6 AC"
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def topo(n: int, link) -> str:
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    rows = []
    for i in range(n):
        cells = [" X " if i == j else link(i, j) for j in range(n)]
        cpus, numa = ("0-47,96-143", "0") if i < n // 2 else ("48-95,144-191", "1")
        rows.append(f"GPU{i}\t" + "\t".join(cells) + f"\tPIX\t{cpus}\t{numa}\t\tN/A\n")
    rows.append("NIC0\t" + "\t".join("PIX" for _ in range(n)) + "\t X \n")
    return head + "".join(rows) + LEGEND


NVLINK_TOPO = topo(8, lambda i, j: "NV18")
PCIE_TOPO = topo(8, lambda i, j: "NODE" if (i < 4) == (j < 4) else "SYS")

FAKE_SMI = f"""#!{sys.executable}
import os, sys
d = os.environ["FAKE_SMI_DIR"]
args = sys.argv[1:]
if os.path.exists(os.path.join(d, "broken")):
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    sys.exit(9)
name = {{"--query-gpu=name": "names", "topo": "topo", "--query-gpu=memory.used": "memory"}}[args[0]]
if name == "memory":
    counter = os.path.join(d, "calls")
    calls = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(calls + 1))
    lines = open(os.path.join(d, "memory")).read().split("---")
    sys.stdout.write(lines[min(calls, len(lines) - 1)].strip() + "\\n")
else:
    sys.stdout.write(open(os.path.join(d, name)).read())
"""


@pytest.fixture
def fake_smi(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)

    def install(names: list[str], topology: str = "", memory: str = "") -> dict:
        (tmp_path / "names").write_text("".join(f"{n}\n" for n in names))
        (tmp_path / "topo").write_text(topology)
        (tmp_path / "memory").write_text(memory)
        return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SMI_DIR": str(tmp_path)}

    return install


def no_smi_env(tmp_path) -> dict:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return {"PATH": str(empty)}


def test_topology_parsing():
    assert nvlink_links(NVLINK_TOPO) == 8 * 7
    assert nvlink_links(PCIE_TOPO) == 0
    assert nvlink_links("\x1b[4mGPU0\tGPU1\x1b[0m\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n") == 2


def test_b300_nvlink_suggests_tp8_nvls(fake_smi):
    env = fake_smi([B300] * 8, NVLINK_TOPO)
    proc = k26("detect", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "nvlink-tp8-nvls\n"
    assert "8x NVIDIA B300 SXM6 AC over NVLink" in proc.stderr
    found = json.loads(k26("detect", "--json", env=env).stdout)
    assert found["suggested"] == "nvlink-tp8-nvls" and found["nvlink"] is True and len(found["gpus"]) == 8


def test_rtx_pro_pcie_suggests_ep8_and_mentions_the_throughput_variant(fake_smi):
    proc = k26("detect", env=fake_smi([RTX] * 8, PCIE_TOPO))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "pcie-ep8\n"
    assert "over PCIe" in proc.stderr and "pcie-ep4-tp2" in proc.stderr


def test_explicit_profile_wins_and_says_so(fake_smi):
    proc = k26("detect", "--profile", "pcie-ep4-tp2", env=fake_smi([RTX] * 8, PCIE_TOPO))
    assert proc.returncode == 0 and proc.stdout == "pcie-ep4-tp2\n"
    assert "suggests pcie-ep8" in proc.stderr


def test_other_gpu_counts_get_advice_not_a_guess(fake_smi):
    proc = k26("detect", env=fake_smi([RTX] * 4, topo(4, lambda i, j: "PXB")))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "4x NVIDIA RTX PRO 6000" in proc.stderr and "--set parallel.tp_size=4" in proc.stderr


def test_without_gpus_it_says_so_and_takes_the_explicit_profile(tmp_path, fake_smi):
    env = no_smi_env(tmp_path)
    bare = k26("detect", env=env)
    assert bare.returncode == 2 and "Traceback" not in bare.stderr
    assert bare.stderr.strip() == ("k26-deploy: error: no NVIDIA GPUs found (nvidia-smi not on PATH); choose a "
                                   "profile with --profile (nvlink-tp8-nvls, pcie-ep4-tp2, pcie-ep8)")
    chosen = k26("detect", "--profile", "pcie-ep8", env=env)
    assert chosen.returncode == 0 and chosen.stdout == "pcie-ep8\n"
    assert "no NVIDIA GPUs found" in chosen.stderr
    broken_env = fake_smi([RTX] * 8, PCIE_TOPO)
    (tmp_path / "broken").write_text("")
    broken = k26("detect", env=broken_env)
    assert broken.returncode == 2 and "couldn't communicate with the NVIDIA driver" in broken.stderr


def test_wait_gpu_free_waits_for_memory_then_passes(fake_smi):
    env = fake_smi([RTX] * 2, memory="70000\n500\n---\n30000\n500\n---\n300\n500\n")
    proc = k26("wait-gpu-free", "--timeout", "30", "--max-used-mib", "1024", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "GPU0 70000 MiB" in proc.stdout and "GPU memory free on 2 GPUs" in proc.stdout


def test_wait_gpu_free_is_bounded(fake_smi):
    proc = k26("wait-gpu-free", "--timeout", "1", "--max-used-mib", "1024", env=fake_smi([RTX], memory="90000\n"))
    assert proc.returncode == 1
    assert "GPU memory still in use after 1 s: GPU0 90000 MiB" in proc.stderr


def test_wait_gpu_free_without_gpus_is_a_no_op(tmp_path):
    proc = k26("wait-gpu-free", "--timeout", "1", env=no_smi_env(tmp_path))
    assert proc.returncode == 0 and "nvidia-smi not on PATH" in proc.stdout
