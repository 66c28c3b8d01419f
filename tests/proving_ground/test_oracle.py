"""The test-only oracle drafter: installed as the worker's top-K hook only when its variable is
set, deterministic rank placement, and trees that exercise every commit path when verified
against the AR continuation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from k26_ddtree.core.tree import build_ddtree
from k26_ddtree.core.verify import committed_tokens, verify_greedy
from k26_ddtree.sglang.common.args import TOPK_HOOK_ENV
from k26_ddtree.sglang.common.draft import topk_hook_from_env
from proving_ground.oracle import ENV_VAR, HOOK, PLACE_ABSENT, Oracle, OracleError, place_token

PROMPT = [5, 6, 7]
AR = [40 + i for i in range(200)]


def req(output_ids, prompt=PROMPT):
    return SimpleNamespace(origin_input_ids=list(prompt), output_ids=list(output_ids))


def test_hook_off_unless_the_environment_names_it(monkeypatch, tmp_path):
    monkeypatch.delenv(TOPK_HOOK_ENV, raising=False)
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert topk_hook_from_env() is None
    path = tmp_path / "oracle.json"
    path.write_text(json.dumps({"prompts": [{"input_ids": PROMPT, "ar_output_ids": AR}], "seed": 3}))
    monkeypatch.setenv(ENV_VAR, str(path))
    assert topk_hook_from_env() is None, "the oracle's file alone installs nothing"
    monkeypatch.setenv(TOPK_HOOK_ENV, HOOK)
    hook = topk_hook_from_env()
    assert isinstance(hook.__self__, Oracle) and hook.__self__.seed == 3
    path.write_text("{not json")
    with pytest.raises(OracleError, match=ENV_VAR):
        topk_hook_from_env()


@pytest.mark.parametrize("spec", ["proving_ground.oracle", "proving_ground.oracle:nothing_here",
                                  "proving_ground.oracle:ENV_VAR", ":topk_hook"])
def test_a_hook_that_names_no_callable_stops_the_start(monkeypatch, spec):
    monkeypatch.setenv(TOPK_HOOK_ENV, spec)
    with pytest.raises(ValueError, match="names no callable"):
        topk_hook_from_env()


def test_the_serving_package_never_imports_the_proving_ground():
    """Every module of k26_ddtree, imported in a fresh interpreter, leaves proving_ground unloaded,
    and no source line of the package names it."""
    import subprocess
    import sys
    from pathlib import Path

    import k26_ddtree

    package = Path(k26_ddtree.__file__).parent
    offenders = [str(p.relative_to(package)) for p in package.rglob("*.py") if "proving_ground" in p.read_text()]
    assert offenders == []
    modules = sorted(".".join(p.relative_to(package.parent).with_suffix("").parts) for p in package.rglob("*.py")
                     if p.name != "__main__.py")
    script = ("import importlib, sys\n"
              f"for m in {modules!r}:\n"
              "    try: importlib.import_module(m)\n"
              "    except ImportError as e:\n"
              "        if 'sglang' not in str(e) and 'triton' not in str(e): raise\n"
              "print(sorted(n for n in sys.modules if n.split('.')[0] == 'proving_ground'))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=package.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_place_token_puts_the_token_at_the_rank_and_nowhere_else():
    row = torch.tensor([9, 8, 7, 6])
    assert place_token(row, 99, 0).tolist() == [99, 9, 8, 7]
    assert place_token(row, 99, 2).tolist() == [9, 8, 99, 7]
    assert place_token(row, 99, PLACE_ABSENT).tolist() == [9, 8, 7, 6]
    assert place_token(row, 8, 0).tolist() == [8, 9, 7, 6]
    absent = place_token(row, 8, PLACE_ABSENT).tolist()
    assert 8 not in absent and len(set(absent)) == 4


def test_placement_is_deterministic_and_covers_every_kind():
    oracle = Oracle([{"input_ids": PROMPT, "ar_output_ids": AR}], seed=11)
    again = Oracle([{"input_ids": PROMPT, "ar_output_ids": AR}], seed=11)
    ranks = [oracle.placement(0, length, d, 4) for length in range(1, 60) for d in range(1, 8)]
    assert ranks == [again.placement(0, length, d, 4) for length in range(1, 60) for d in range(1, 8)]
    assert {0, PLACE_ABSENT} <= set(ranks) and set(ranks) & {1, 2, 3}
    assert set(ranks) <= {PLACE_ABSENT, 0, 1, 2, 3}
    assert {oracle.placement(0, length, 1, 1) for length in range(1, 200)} == {0, PLACE_ABSENT}
    other_seed = Oracle([{"input_ids": PROMPT, "ar_output_ids": AR}], seed=12)
    assert ranks != [other_seed.placement(0, length, d, 4) for length in range(1, 60) for d in range(1, 8)]


def test_rewrite_only_touches_known_requests_on_their_ar_path():
    oracle = Oracle([{"input_ids": PROMPT, "ar_output_ids": AR}], seed=5)
    depth, topk = 7, 4
    tokens = torch.arange(3 * depth * topk).view(3, depth, topk) + 1000
    logprobs = torch.linspace(-1, -9, topk).expand(3, depth, topk).clone()
    reqs = [req(AR[:10]), req(AR[:10], prompt=[1, 2]), req(AR[:9] + [0])]
    new_tokens, new_logprobs = oracle.rewrite(reqs, tokens, logprobs)
    assert torch.equal(new_tokens[1:], tokens[1:]) and torch.equal(new_logprobs[1:], logprobs[1:])
    for d in range(depth):
        rank = oracle.placement(0, 10, d + 1, topk)
        row = new_tokens[0, d].tolist()
        if rank == PLACE_ABSENT:
            assert AR[10 + d] not in row
        else:
            assert row[rank] == AR[10 + d]
    assert bool((new_logprobs[0, :, 1:] < new_logprobs[0, :, :-1]).all()) and bool((new_logprobs <= 0).all())


def test_rewrite_stops_at_the_end_of_the_ar_output():
    oracle = Oracle([{"input_ids": PROMPT, "ar_output_ids": AR[:12]}], seed=5)
    tokens = torch.zeros(1, 7, 2, dtype=torch.long) + 3
    new_tokens, _ = oracle.rewrite([req(AR[:10])], tokens, torch.tensor([-0.1, -2.0]).expand(1, 7, 2).clone())
    assert torch.equal(new_tokens[0, 2:], tokens[0, 2:])


@pytest.mark.parametrize("budget, topk", [(4, 1), (8, 4), (16, 4), (32, 8), (64, 8)])
def test_oracle_trees_exercise_every_commit_path(budget, topk):
    """Verify oracle trees against a target that continues exactly like AR, step after step."""
    depth = 7
    oracle = Oracle([{"input_ids": PROMPT, "ar_output_ids": AR}], seed=7)
    output = AR[:1]
    accept_lens, sibling_hits, steps = [], 0, 0
    gen = torch.Generator().manual_seed(budget * topk)
    while len(output) < 150:
        drafter = torch.randint(0, 30, (1, depth, topk), generator=gen)
        drafter_lp = torch.linspace(-2, -6, topk).expand(1, depth, topk).clone()
        tokens, logprobs = oracle.rewrite([req(output)], drafter, drafter_lp)
        tree = build_ddtree(torch.tensor([output[-1]]), tokens, logprobs, budget, validate=False)
        # The target's argmax after a node is the AR token following that node's path.
        paths = {0: len(output)}
        target_next = torch.zeros(1, budget + 1, dtype=torch.long)
        for i in range(budget + 1):
            if i:
                parent = int(tree.parents[0, i])
                on_path = paths.get(parent) is not None and int(tree.tokens[0, i]) == AR[paths[parent]]
                paths[i] = paths[parent] + 1 if on_path else None
            target_next[0, i] = AR[paths[i]] if paths[i] is not None else 0
        acc = verify_greedy(tree, target_next)
        n = int(acc.accept_len[0])
        committed = committed_tokens(tree, acc)[0, : n + 1].tolist()
        assert committed == AR[len(output) : len(output) + n + 1], "greedy commits exactly the AR tokens"
        ranks_taken = [int((tree.parents[0] == int(acc.path[0, j - 1])).nonzero()[0]) != int(acc.path[0, j])
                       for j in range(1, n + 1)]
        sibling_hits += sum(ranks_taken)
        accept_lens.append(n)
        output += committed
        steps += 1
    assert max(accept_lens) == min(depth, budget), "some steps accept the full depth"
    assert min(accept_lens) < min(depth, budget), "some steps accept partially"
    assert sum(accept_lens) / steps > 2.0, "acceptance is high"
    if topk > 1 and budget > depth:
        assert sibling_hits > 0, "non-first siblings get accepted"
