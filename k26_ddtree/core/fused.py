"""Which implementation a core function runs: its fused Triton kernel or its torch ops.

The torch ops define the result and run anywhere; a fused kernel computes the
same result in one launch, which is what matters on the GPU, where dozens of
tiny launches cost more than the work. Triton is imported only when a kernel
is chosen, so the core imports and runs on the CPU without it.
"""

from __future__ import annotations

import importlib
import os
from functools import lru_cache

import torch

# The kernels hold a request's nodes-against-nodes block in registers; they were
# compiled and checked on the H200 up to budget 64 (a 128-wide block), so larger
# trees take the torch ops.
MAX_FUSED_NODES = 128


@lru_cache(maxsize=None)
def _kernel(module: str, name: str):
    try:
        return getattr(importlib.import_module(f"k26_ddtree.{module}"), name)
    except ModuleNotFoundError as missing:
        # Only a missing Triton means "no kernels here"; any other import error is a bug to see.
        if missing.name and missing.name.split(".")[0] == "triton":
            return None
        raise


def fused_kernel(fused: bool | None, tensor: torch.Tensor, nodes: int, module: str, name: str):
    """k26_ddtree.<module>.<name> (module e.g. "core.tree_kernel"), or None where the torch ops should run.

    fused None: the kernel for CUDA tensors of trees of at most MAX_FUSED_NODES nodes,
    when Triton is importable; True: the kernel, or a ValueError saying why it cannot
    run (on CPU tensors it needs Triton's interpreter, TRITON_INTERPRET=1, set before
    the first kernel call); False: the torch ops.
    """
    if fused is False:
        return None
    if fused is None:
        return _kernel(module, name) if tensor.is_cuda and nodes <= MAX_FUSED_NODES else None
    if nodes > MAX_FUSED_NODES:
        raise ValueError(f"fused=True supports trees of at most {MAX_FUSED_NODES} nodes, got {nodes}")
    if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("fused=True on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1")
    kernel = _kernel(module, name)
    if kernel is None:
        raise ValueError("fused=True needs Triton, which cannot be imported here")
    return kernel
