"""How sure the trace is of each choice: the best config's predicted lead over the runner-up per
concurrency, with an interval from resampling the trace's requests.

The step times come from the costs and stay fixed; what a different sample of traffic changes is
the acceptance, and a request's steps share its text, so requests (not steps) are resampled
(with replacement, as many as the trace holds). A lead whose interval holds zero is one the trace
cannot tell from chance: the two configs need a larger trace, or a bench of both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k26_ddtree.tune.estimate import Acceptance
from k26_ddtree.tune.predict import Plan

RESAMPLES = 1000
LEVEL = 0.95
SEED = 0


@dataclass(frozen=True)
class Lead:
    """The best config's tok/s over the runner-up's, minus 1: as predicted, and the interval."""

    lead: float
    low: float
    high: float

    def separated(self, requests: int) -> bool:
        return requests >= 2 and self.low > 0

    def text(self, requests: int) -> str:
        if requests < 2:
            return f"{100 * self.lead:+.1f}%; the trace holds one request: too small to separate them"
        span = (f"{100 * self.lead:+.1f}% ({100 * LEVEL:.0f}% interval {100 * self.low:+.1f}% to "
                f"{100 * self.high:+.1f}%, resampling the trace's {requests} requests)")
        return span if self.separated(requests) else f"{span}: the trace is too small to separate them"


def leads(found: Acceptance, plan: Plan) -> dict[int, Lead]:
    """Per C with a runner-up, the best config's lead over it."""
    column = {shape: index for index, shape in enumerate(found.shapes)}
    groups = found.sums.shape[0]
    gen = torch.Generator().manual_seed(SEED)
    picks = torch.randint(0, groups, (RESAMPLES, groups), generator=gen)
    weights = torch.zeros(RESAMPLES, groups, dtype=torch.float64).scatter_add_(
        1, picks, torch.ones(RESAMPLES, groups, dtype=torch.float64))
    sums = found.sums.double()
    out = {}
    for c in sorted(plan.ranked):
        best, second = plan.best(c), plan.runner_up(c)
        if second is None:
            continue
        # The served scale, C and the steps divide both acceptances alike: only the ratio of the sums varies.
        pair = sums[:, [column[best.config.shape], column[second.config.shape]]]
        resampled = weights @ pair
        ratio = resampled[:, 0] / resampled[:, 1].clamp(min=1e-12) * (second.step_s / best.step_s) - 1
        tail = (1 - LEVEL) / 2
        low, high = torch.quantile(ratio, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
        lead = best.tok_s / second.tok_s - 1
        # One request resamples to itself: no interval says anything then.
        out[c] = Lead(lead, low, high) if groups >= 2 else Lead(lead, lead, lead)
    return out
