"""The DDTree budget's upper bound, in a torch-free module: the core, the SGLang wiring, the
profile validation and the proving-ground matrix all check budgets against this one rule."""


def max_budget(depth: int, topk: int) -> int:
    """Number of distinct prefixes of length 1..depth over topk ranks: sum of topk^d.

    With a DFlash block of size B the depth is B - 1 (position 0 is the root)."""
    return sum(topk**d for d in range(1, depth + 1))
