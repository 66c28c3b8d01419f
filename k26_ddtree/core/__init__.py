"""The DDTree algorithm: pure torch, batched, shape-documented; no SGLang, no host syncs on the hot path.

Two numbers size a step, each with one name from the flags down: the `budget`, the draft
nodes a tree keeps, and the `verify_width` N = budget + 1, the tokens (root and nodes) one
request puts through the target's verify. Shapes write N for the verify width. SGLang's own
names for the width (speculative_num_draft_tokens, draft_token_num, num_tokens_per_bs) appear
only where SGLang reads or writes them.

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
