"""The exact model the proving ground's bf16 servers approximate: its trained target computed in fp32.

The lossless rule (proving_ground.lossless) asks it, at a divergence from the AR reference that
the reference's own gap does not explain, how far below its top-1 the two tokens lie.
It runs on the CPU, once per divergence (each answer is kept): one forward of a prompt and its
output so far.

    python -m proving_ground.exact --models DIR --oracle oracle-runRUN.json --report e2e-runRUN.json [--exact-eps E]

judges a finished run's greedy speed cells again under the same rule (the runner does it as it
goes): each request's first divergence, the exact model's answer where the reference's gap does
not make it a tie, and the cell's verdict. --oracle gives the run's prompts and AR outputs.

    python -m proving_ground.exact --models DIR --oracle oracle-runRUN.json --reference [--exact-eps E]

judges the AR reference itself: every position where its token lies more than exact_eps below the
exact model's top-1. The rule trusts the reference outside ties, so a serving path whose AR
departs from the model where others do not reads as their failure; this says where it does.
Exit 0 when every cell (or every reference token) is within the rule, 1 when one is not, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from k26_ddtree.errors import UserError

# What an emulated folder adds to the trained target's config.json (proving_ground.emulator.folder).
EMULATOR_KEYS = ("architectures", "k26_emulator")


def is_tiny_target(models: Path) -> bool:
    """Whether models/target is the tiny target train makes (emulated or not), rather than, say,
    a widened one, which has no exact model here."""
    from proving_ground import tinymodel

    try:
        config = json.loads((models / "target" / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    mine = {k: v for k, v in config.items() if k not in EMULATOR_KEYS}
    return mine == {k: v for k, v in tinymodel.TARGET_CONFIG.items() if k not in EMULATOR_KEYS}


class ExactTarget:
    """below_top(prompt, output prefix, a, b): how far tokens a and b lie below the top-1 fp32
    logit of the next token after prompts[prompt] + the output prefix. The weights load at the
    first question."""

    def __init__(self, models: Path, prompts: list[list[int]]):
        self.weights = models / "target" / "model.safetensors"
        self.prompts = prompts
        self._target = None
        self._answers: dict[tuple, tuple[float, float]] = {}

    def _load(self):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from proving_ground import tinymodel

        try:
            state = load_file(str(self.weights))
            target = tinymodel.TinyDeepseekV3()
            target.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
        except (OSError, SafetensorError, RuntimeError) as err:
            raise UserError(f"{self.weights}: not the tiny target's weights ({str(err).splitlines()[0]})") from None
        return target.eval()

    def _logits(self, prompt: int, output_prefix: list[int]):
        """[len(output_prefix) + 1, vocab] fp64: the next-token logits after the prompt and each
        prefix of output_prefix, from one forward (the target is causal)."""
        import torch

        if self._target is None:
            self._target = self._load()
        prompt_ids = list(self.prompts[prompt])
        with torch.no_grad():
            logits = self._target(torch.tensor([prompt_ids + list(output_prefix)]))[0][0]
        return logits[len(prompt_ids) - 1:].double()

    def below_top(self, prompt: int, output_prefix: list[int], a: int, b: int) -> tuple[float, float]:
        key = (prompt, tuple(output_prefix), a, b)
        if key not in self._answers:
            logits = self._logits(prompt, output_prefix)[-1]
            top = logits.max()
            self._answers[key] = (float(top - logits[a]), float(top - logits[b]))
        return self._answers[key]

    def below_top_along(self, prompt: int, output: list[int]):
        """([len(output)] how far each output token lies below its position's top-1 fp32 logit,
        [len(output)] that top-1 token)."""
        import torch

        logits = self._logits(prompt, output[:-1])
        return logits.max(-1).values - logits.gather(-1, torch.tensor(output)[:, None])[:, 0], logits.argmax(-1)


def exact_model(models: Path, prompts: list[list[int]]):
    """ExactTarget(models, prompts).below_top, or None when models/target has no exact model here."""
    return ExactTarget(models, prompts).below_top if is_tiny_target(models) else None


def required_exact_target(models: Path, prompts: list[list[int]]) -> ExactTarget:
    """ExactTarget(models, prompts); UserError when models/target has no exact model here."""
    if not is_tiny_target(models):
        raise UserError(f"{models}/target/config.json: missing, or not the tiny target, so there is no exact model")
    return ExactTarget(models, prompts)


def _ids(value) -> list[int]:
    if not isinstance(value, list) or not all(type(t) is int for t in value):
        raise TypeError(f"expected a list of token ids, got {str(value)[:60]}")
    return value


def oracle_ids(oracle: dict) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, AR reference outputs) of an oracle-runRUN.json; UserError when it is not one."""
    rows = oracle.get("prompts") if isinstance(oracle, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise UserError("the oracle file has no list of prompts: not an oracle-runRUN.json")
    return [_ids(r["input_ids"]) for r in rows], [_ids(r["ar_output_ids"]) for r in rows]


def rejudge(report: dict, oracle: dict, models: Path, exact_eps: float) -> list[dict]:
    """Per greedy speed cell of an e2e report: its divergences judged again by the lossless rule
    with the exact model of `models`, and the verdict. UserError where the files disagree."""
    from proving_ground import lossless

    prompts, references = oracle_ids(oracle)
    if not isinstance(report, dict) or not isinstance(report.get("speed"), list) or "eps" not in report:
        raise UserError("the report has no 'eps' and 'speed' list: not an e2e-runRUN.json of a speed run")
    if report.get("prompts") != len(prompts):
        raise UserError(f"the report served {report.get('prompts')} prompts and the oracle holds {len(prompts)}: "
                        "not the same run")
    rule = lossless.TieRule(float(report["eps"]), required_exact_target(models, prompts).below_top, exact_eps)
    cells = []
    for cell in report["speed"]:
        if not isinstance(cell, dict):
            raise UserError("a speed cell of the report is not an object")
        listed = cell.get("divergences") or []
        if not cell.get("repeat_tok_s") or (cell.get("verdict") in ("completed", None) and not listed):
            continue  # a cell the run's deadline left unmeasured, or a sampled one: nothing to judge
        judged = []
        for d in listed:
            prompt, pos = int(d["prompt"]), int(d["position"])
            if not 0 <= prompt < len(prompts) or not 0 <= pos <= len(references[prompt]):
                raise UserError(f"{cell['server']}/{cell['cell']}: divergence p{prompt}@{pos} is outside the oracle")
            if (references[prompt][pos] if pos < len(references[prompt]) else -1) != int(d["reference_token"]):
                raise UserError(f"{cell['server']}/{cell['cell']}: the oracle's token at p{prompt}@{pos} is not the "
                                "report's reference token: not the same run")
            judged.append(lossless.judge(prompt, pos, references[prompt], int(d["got_token"]), d["gap"], rule))
        verdict = lossless.verdict(judged)
        # A cell's summary keeps its first divergences only, and request errors fail it whatever they are.
        if cell.get("errors") or cell.get("divergence_count", len(listed)) > len(listed):
            verdict = "FAIL"
        cells.append({"server": cell["server"], "cell": cell["cell"], "verdict": verdict,
                      "divergences": [j.as_dict() for j in judged]})
    return cells


def reference_departures(oracle: dict, models: Path, exact_eps: float) -> tuple[int, list[dict]]:
    """(positions judged, each position where the AR reference's token lies more than exact_eps
    below the exact model's top-1: {prompt, position, token, top1, below})."""
    prompts, references = oracle_ids(oracle)
    target = required_exact_target(models, prompts)
    judged, departures = 0, []
    for index, output in enumerate(references):
        if not prompts[index] or not output:
            continue
        below, top1 = target.below_top_along(index, output)
        judged += len(output)
        for pos in (below > exact_eps).nonzero()[:, 0].tolist():
            departures.append({"prompt": index, "position": pos, "token": output[pos],
                               "top1": int(top1[pos]), "below": float(below[pos])})
    return judged, departures


def divergence_text(d: dict) -> str:
    """A divergence's reference gap, and where the exact model was asked, how far each token lies
    below its top-1 (the reference's token, then the produced one)."""
    gap = "None" if d["gap"] is None else f"{d['gap']:.3f}"
    below = d.get("exact_below_top")
    return gap if below is None else f"{gap} (exact below top-1: {below[0]:.3f} / {below[1]:.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving_ground.exact", description=__doc__.split("\n")[0])
    parser.add_argument("--models", required=True, type=Path, help="the pair's folder (its target/ is the model)")
    parser.add_argument("--oracle", required=True, type=Path, help="the run's oracle-runRUN.json (prompts, AR outputs)")
    judged = parser.add_mutually_exclusive_group(required=True)
    judged.add_argument("--report", type=Path, help="the run's e2e-runRUN.json: judge its greedy speed cells")
    judged.add_argument("--reference", action="store_true",
                        help="judge the oracle's AR reference itself against the exact model")
    parser.add_argument("--exact-eps", type=float,
                        help="nats, > 0 (default: the report's exact_eps, else 0.25 as in matrix.json)")
    args = parser.parse_args(argv)
    try:
        oracle = json.loads(args.oracle.read_text())
        report = json.loads(args.report.read_text()) if args.report else {}
        exact_eps = args.exact_eps if args.exact_eps is not None else (
            report.get("exact_eps") if isinstance(report, dict) and report.get("exact_eps") else 0.25)
        if not (math.isfinite(exact_eps) and exact_eps > 0):
            raise UserError(f"--exact-eps {exact_eps}: expected a finite number of nats > 0")
        if args.reference:
            judged, departures = reference_departures(oracle, args.models, float(exact_eps))
        else:
            cells = rejudge(report, oracle, args.models, float(exact_eps))
    except (OSError, ValueError) as err:
        print(f"exact: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        print(f"exact: error: the report or the oracle is not as the runner writes it ({type(err).__name__}: {err})",
              file=sys.stderr)
        return 2
    except UserError as err:
        print(f"exact: error: {err}", file=sys.stderr)
        return 2
    if args.reference:
        for d in departures:
            print(f"p{d['prompt']}@{d['position']}: the reference's token {d['token']} lies {d['below']:.3f} nats "
                  f"below the exact model's top-1 {d['top1']}")
        print(f"reference: {len(departures)} of {judged} tokens more than {exact_eps:g} nats below the exact "
              "model's top-1")
        return 1 if departures else 0
    for cell in cells:
        shown = ", ".join(f"p{d['prompt']}@{d['position']} gap {divergence_text(d)}" for d in cell["divergences"])
        print(f"{cell['cell']} {cell['server']}: {cell['verdict']} ({shown or 'no divergence'})")
    return 1 if any(cell["verdict"] == "FAIL" for cell in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
