"""Suggest a shipped profile from the GPUs nvidia-smi reports (count, name, NVLink or PCIe)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from k26_ddtree.deploy import nvidia

# The hardware each shipped profile was measured on (field data).
TUNED_FOR = {
    "pcie-ep8": "RTX PRO 6000",
    "pcie-ep4-tp2": "RTX PRO 6000",
    "nvlink-tp8-nvls": "B300",
}


@dataclass
class Detection:
    profile: str | None
    reason: str
    gpus: list[str] = field(default_factory=list)
    nvlink: bool = False
    notes: list[str] = field(default_factory=list)


def detect() -> Detection:
    names, why = nvidia.gpu_names()
    if names is None:
        return Detection(None, f"no NVIDIA GPUs found ({why})")
    topo = nvidia.topology()
    nvlink = topo.ok and nvidia.nvlink_links(topo.output) > 0
    link = "NVLink" if nvlink else "PCIe"
    kinds = ", ".join(f"{n}x {name}" for name, n in Counter(names).items())
    found = Detection(None, "", gpus=names, nvlink=nvlink)
    if not topo.ok:
        found.notes.append(f"topology unknown ({topo.output}); assuming PCIe")
    if len(names) != 8:
        start = "nvlink-tp8-nvls" if nvlink else "pcie-ep8"
        found.reason = (
            f"{kinds} over {link}: the shipped profiles are for 8 GPUs; start from {start} "
            f"with --set parallel.tp_size={len(names)} (and parallel.ep_size)"
        )
        return found
    found.profile = "nvlink-tp8-nvls" if nvlink else "pcie-ep8"
    found.reason = f"{kinds} over {link}"
    if not nvlink:
        found.notes.append("for the best aggregate throughput at high concurrency try pcie-ep4-tp2")
    tuned = TUNED_FOR[found.profile]
    if not any(tuned in name for name in names):
        found.notes.append(f"{found.profile} was tuned on {tuned}; re-run the budget sweep on this hardware")
    return found
