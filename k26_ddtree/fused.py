"""Which implementation a core function runs: its fused Triton kernel or its torch ops.

The torch ops define the result and run anywhere; a fused kernel computes the
same result in one launch, which is what matters on the GPU, where dozens of
tiny launches cost more than the work. Triton is imported lazily, so the core
imports (and runs on the CPU) without it.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

import torch


@lru_cache(maxsize=None)
def _kernel(module: str, name: str):
    try:
        return getattr(importlib.import_module(f"k26_ddtree.{module}"), name)
    except ImportError:
        return None


def fused_kernel(fused: bool | None, tensor: torch.Tensor, module: str, name: str):
    """k26_ddtree.<module>.<name>, or None where the torch ops should run.

    fused None: the kernel for CUDA tensors when Triton is importable; True: the
    kernel whatever the device (Triton's CPU interpreter, TRITON_INTERPRET=1, runs
    it on CPU tensors); False: the torch ops.
    """
    if fused is False:
        return None
    kernel = _kernel(module, name)
    if fused and kernel is None:
        raise ValueError("fused=True needs Triton, which cannot be imported here")
    return kernel if fused or tensor.is_cuda else None
