"""The exact model the proving ground's bf16 servers approximate: its trained target in fp32.

The lossless rule (proving_ground.lossless) asks it, at a divergence from the AR reference that
the reference's own gap does not explain, how far apart the two tokens' logits really are.
It runs on the CPU, once per such divergence: one forward of a prompt and its output so far.

    python -m proving_ground.exact --models DIR --oracle oracle-runRUN.json --report e2e-runRUN.json [--exact-eps E]

judges a finished run's divergences again under the same rule (the runner does it as it goes):
every cell's first divergence per request, the exact margin where the reference's gap does not
make it a tie, and the cell's verdict. --oracle gives the run's prompts and AR outputs.
"""

from __future__ import annotations

import argparse
import json
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
    """margin(prompt, output prefix, a, b) = fp32 logit(a) - logit(b) of the next token after
    prompts[prompt] + the output prefix. The weights load at the first question."""

    def __init__(self, models: Path, prompts: list[list[int]]):
        self.weights = models / "target" / "model.safetensors"
        self.prompts = prompts
        self._target = None

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

    def margin(self, prompt: int, output_prefix: list[int], a: int, b: int) -> float:
        import torch

        if self._target is None:
            self._target = self._load()
        ids = torch.tensor([list(self.prompts[prompt]) + list(output_prefix)])
        with torch.no_grad():
            logits, _ = self._target(ids)
        return float(logits[0, -1, a].double() - logits[0, -1, b].double())


def exact_margin(models: Path, prompts: list[list[int]]):
    """ExactTarget(models, prompts).margin, or None when models/target has no exact model here."""
    return ExactTarget(models, prompts).margin if is_tiny_target(models) else None


def rejudge(report: dict, oracle: dict, models: Path, rule_eps: float, exact_eps: float) -> list[dict]:
    """Per greedy speed cell of an e2e report: its divergences judged again by the lossless rule
    with the exact model of `models`, and the verdict."""
    from proving_ground import lossless

    prompts = [row["input_ids"] for row in oracle["prompts"]]
    margin = exact_margin(models, prompts)
    if margin is None:
        raise UserError(f"{models}/target: not the tiny target, so there is no exact model to ask")
    rule = lossless.TieRule(rule_eps, margin, exact_eps)
    cells = []
    for cell in report.get("speed") or []:
        if not cell.get("divergences") and cell.get("verdict") not in ("FAIL", "lossless (ties only)"):
            continue
        judged = []
        for d in cell.get("divergences") or []:
            reference = oracle["prompts"][d["prompt"]]["ar_output_ids"]
            got = reference[:d["position"]] + ([d["got_token"]] if d["got_token"] >= 0 else [])
            top2 = [[] for _ in reference]
            if d["gap"] is not None:
                top2[d["position"]] = [[0.0, d["reference_token"]], [-d["gap"], -1]]
            judged.append(lossless.check_request(d["prompt"], reference, top2, got, rule))
        judged = [j for j in judged if j is not None]
        cells.append({"server": cell["server"], "cell": cell["cell"], "verdict": lossless.verdict(judged),
                      "divergences": [j.as_dict() for j in judged]})
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving_ground.exact", description=__doc__.split("\n")[0])
    parser.add_argument("--models", required=True, type=Path, help="the pair's folder (its target/ is the model)")
    parser.add_argument("--oracle", required=True, type=Path, help="the run's oracle-runRUN.json (prompts, AR outputs)")
    parser.add_argument("--report", required=True, type=Path, help="the run's e2e-runRUN.json")
    parser.add_argument("--exact-eps", type=float, default=0.25, help="nats (default 0.25, as the matrix's exact_eps)")
    args = parser.parse_args(argv)
    try:
        report, oracle = (json.loads(path.read_text()) for path in (args.report, args.oracle))
        cells = rejudge(report, oracle, args.models, float(report["eps"]), args.exact_eps)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        print(f"exact: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except UserError as err:
        print(f"exact: error: {err}", file=sys.stderr)
        return 2
    for cell in cells:
        shown = ", ".join(f"p{d['prompt']}@{d['position']} gap {'-' if d['gap'] is None else round(d['gap'], 3)} exact "
                          f"{'-' if d['exact_margin'] is None else round(d['exact_margin'], 3)}"
                          for d in cell["divergences"])
        print(f"{cell['cell']} {cell['server']}: {cell['verdict']} ({shown or 'no divergence'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
