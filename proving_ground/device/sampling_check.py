"""Exact tree sampling through the serving path on a GPU: 30 cases and two controls.

    PYTHONPATH=SITE python proving_ground/device/sampling_check.py [--draws N] [--alpha A]

SITE is an installed bundle (SGLang 0.5.11 or 0.5.17, sgl_kernel). Each case is a tree shape
(depth, top-K, budget, spine) and a sampling law (temperature 0.7 or 1.0, top-k, top-p) over a
synthetic target whose autoregressive law is known (tests/core/sampling_law.py). N copies of one
context go through that SGLang version's DDTree verify input, as the server calls it: the
target's raw logits in, `accept` out (target_probs, then sgl_kernel's
tree_speculative_sampling_target_only, which SGLang finds on a GPU). The first committed token,
and the first two (over two steps where the first commits one), must follow the target's law:
chi-square p above A for each. Two controls show a pass is not a test that cannot fail: every
node given the root's logits (a wiring bug the second token must expose), and top-k 3 judged by
the law without it (a law applied wrong); each must give p below 1e-9.

One line per case, then `sampling exactness: P/30, controls caught` (or `missed`). Exit 0 when
every case passes and both controls are caught, 1 otherwise, 2 when this machine cannot run it
(no GPU, an SGLang without DDTree wiring, no tree kernel).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "core")]

from sampling_law import SHAPES, VOCAB, Case, Commit, SyntheticTarget, pvalues, sampling_info  # noqa: E402

from k26_ddtree.core.tree import DDTree  # noqa: E402
from k26_ddtree.sglang.common.step_graphs import StepTree  # noqa: E402

CASES = tuple(Case(d, k, b, s, t, p, tk) for d, k, b, s, p, tk in SHAPES for t in (0.7, 1.0))
# The controls: every node given the root's logits (a wiring bug), and top-k 3 judged by the law
# without it (a law applied wrong); the check must reject both.
CONTROL = Case(3, 3, 16, False, 1.0)
CUT_CONTROL = Case(4, 3, 32, False, 1.0, top_k=3)
ROWS_PER_VERIFY = 1 << 16


class Unrunnable(Exception):
    """This machine cannot run the check; the message says why."""


def version_accept(version: str):
    """accept(step, logits [B * W, V], info) -> PackedAcceptance through `version`'s verify input."""
    if version == "0.5.11":
        from k26_ddtree.sglang.v0_5_11.ddtree_info import DDTreeVerifyInput

        def accept(step: StepTree, logits: torch.Tensor, info) -> object:
            batch = SimpleNamespace(batch_size=lambda: step.tree.tokens.shape[0], sampling_info=info)
            return DDTreeVerifyInput.from_step(step).accept(batch, logits)
    elif version == "0.5.17":
        from k26_ddtree.sglang.v0_5_17.ddtree_info import DDTreeVerifyInputV2

        def accept(step: StepTree, logits: torch.Tensor, info) -> object:
            width = step.tree.tokens.shape[1]
            verify = DDTreeVerifyInputV2(draft_token=step.tree.tokens.reshape(-1), positions=step.positions.reshape(-1),
                                         draft_token_num=width, step=step)
            return verify.accept(logits, info, max_top_k=int(info.top_ks.max()) if info.need_top_k_sampling else VOCAB)
    else:
        raise Unrunnable(f"SGLang {version} has no DDTree wiring here (0.5.11 and 0.5.17 have)")
    return accept


def serving_commit(accept, target: SyntheticTarget, *, root_logits_everywhere: bool = False) -> Commit:
    """The verify input's accept as a sampling_law Commit: raw logits in, committed tokens out."""
    case = target.case

    def commit_rows(tree: DDTree, before_root: torch.Tensor) -> torch.Tensor:
        batch, width = tree.tokens.shape
        logits = target.node_logits(tree, before_root)
        if root_logits_everywhere:
            logits = logits.view(batch, width, VOCAB)[:, :1].expand(-1, width, -1).reshape(-1, VOCAB)
        step = StepTree.of_tree(tree, torch.zeros(batch, dtype=torch.long, device=tree.tokens.device))
        info = sampling_info(batch, case.temperature, case.top_k, case.top_p, tree.tokens.device)
        acceptance = accept(step, logits.contiguous(), info)
        return acceptance.rows[:, : acceptance.width]

    def commit(tree: DDTree, before_root: torch.Tensor) -> torch.Tensor:
        # A verify of at most ROWS_PER_VERIFY nodes, as a server's batch is: flashinfer's top-p
        # renorm sizes its workspace by the rows (200,000 trees of 65 nodes asked for 228 GiB).
        per = max(1, ROWS_PER_VERIFY // tree.tokens.shape[1])
        return torch.cat([commit_rows(part, before_root[i:i + per])
                          for i, part in ((i, tree_rows(tree, i, i + per)) for i in range(0, tree.tokens.shape[0], per))])

    return commit


def tree_rows(tree: DDTree, start: int, stop: int) -> DDTree:
    """Requests [start, stop) of a batch of trees."""
    return DDTree(tree.tokens[start:stop], tree.parents[start:stop], tree.depths[start:stop],
                  tree.node_logws[start:stop], tree.max_depth, tree.best_first)


def run(version: str, device, draws: int, alpha: float, cases=CASES, say=print) -> bool:
    """Every case and the control; True when all pass and the control is caught."""
    accept = version_accept(version)
    passed = 0
    for i, case in enumerate(cases):
        torch.manual_seed(1000 + i)
        t0 = time.perf_counter()
        target = SyntheticTarget(case, device)
        p_first, p_pair, accepted = pvalues(target, draws, serving_commit(accept, target))
        ok = p_first > alpha and p_pair > alpha
        passed += ok
        say(f"{'PASS' if ok else 'FAIL'} {case}: p first {p_first:.3g}, p first two {p_pair:.3g}, "
            f"accepted {accepted.float().mean():.2f} mean / {int(accepted.max())} max, {time.perf_counter() - t0:.1f}s")
    torch.manual_seed(999)
    target = SyntheticTarget(CONTROL, device)
    _, p_wiring, _ = pvalues(target, draws, serving_commit(accept, target, root_logits_everywhere=True))
    target = SyntheticTarget(CUT_CONTROL, device)
    whole = SyntheticTarget(CUT_CONTROL._replace(top_k=None), device)
    p_cut, _, _ = pvalues(target, draws, serving_commit(accept, target), law=whole)
    caught = p_wiring < 1e-9 and p_cut < 1e-9
    for what, case, p in (("every node given the root's logits", CONTROL, p_wiring),
                          ("top-k 3 judged by the law without it", CUT_CONTROL, p_cut)):
        say(f"control ({what}) {case}: p {p:.3g}, {'caught' if p < 1e-9 else 'MISSED'}")
    say(f"sampling exactness: {passed}/{len(cases)}, controls {'caught' if caught else 'missed'}")
    return passed == len(cases) and caught


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--draws", type=int, default=200_000, help="copies of the context per case (default 200000)")
    parser.add_argument("--alpha", type=float, default=1e-4,
                        help="a case fails below this chi-square p (default 1e-4: 60 tests, 0.6%% false alarms)")
    args = parser.parse_args(argv)
    if args.draws < 1000 or not 0 < args.alpha < 1:
        parser.error("--draws must be at least 1000 and --alpha within (0, 1)")
    try:
        if not torch.cuda.is_available():
            raise Unrunnable("no CUDA GPU: the tree kernel runs only there (tests/core checks the torch path)")
        import sglang
        from sglang.srt.speculative import dflash_utils

        if not dflash_utils.is_dflash_sampling_verify_available():
            raise Unrunnable("SGLang finds no sgl_kernel tree_speculative_sampling_target_only here")
        print(f"SGLang {sglang.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}, "
              f"{args.draws} draws per case, alpha {args.alpha}")
        return 0 if run(sglang.__version__, "cuda", args.draws, args.alpha) else 1
    except Unrunnable as e:
        print(f"sampling_check: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
