"""The DDTree algorithm: pure torch, batched, shape-documented; no SGLang, no host syncs on the hot path.

  tree.py       build_ddtree: the `budget` best draft prefixes per request (DDTree)
  retrieve.py   what verification needs from a tree: ancestor mask, positions, the
                first-child / next-sibling encoding of SGLang's tree kernels
  verify.py     Acceptance, verify_greedy, verify_sampling: walk a tree against the target
  reference.py  the tiny obviously-correct heap builder the fast one is tested against
  budget.py     the budget bound and the path-code width (torch-free)
  fused.py      which implementation runs: a fused Triton kernel (CUDA) or the torch ops
  tree_kernel.py, mask_kernel.py, walk_kernel.py
                the fused kernels, bit for bit the torch ops' results
"""
