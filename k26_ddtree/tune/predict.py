"""Predicted tok/s of every config per concurrency, the best per C, and the batch-size schedule.

tok/s(C, config) = C * acceptance(config) / step_s(C, budget(config)): C requests commit
`acceptance` tokens each per step. A config is a DDTree shape, or the plain DFlash chain
(schedule `0`), whose acceptance is the chain tree's (budget D, topk 1) and whose step
time is the DFLASH run's own, where the costs hold one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from k26_ddtree.core.acceptance import TreeShape
from k26_ddtree.tune.costs import Costs
from k26_ddtree.tune.estimate import chain


@dataclass(frozen=True)
class Config:
    shape: TreeShape  # for the DFlash chain: the chain as a tree, whose acceptance it has
    dflash: bool = False

    @property
    def name(self) -> str:
        return f"DFLASH (chain, b{self.shape.budget}k1)" if self.dflash else self.shape.name

    @property
    def token(self) -> str:
        """Its bucket in --speculative-ddtree-budget-schedule: budget/topk, or 0 for the plain chain."""
        return "0" if self.dflash else f"{self.shape.budget}/{self.shape.topk}"

    def reconfigure(self) -> str:
        """The `k26-deploy reconfigure` that serves this config today, for every batch size."""
        if self.dflash:
            return "sudo k26-deploy reconfigure --set speculative.algorithm=DFLASH"
        spine = "true" if self.shape.spine else "false"
        return (f"sudo k26-deploy reconfigure --budget {self.shape.budget} --topk {self.shape.topk} "
                f"--set speculative.algorithm=DDTREE --set speculative.spine={spine}")


@dataclass(frozen=True)
class Prediction:
    config: Config
    concurrency: int
    acceptance: float
    step_s: float

    @property
    def tok_s(self) -> float:
        return self.concurrency * self.acceptance / self.step_s


@dataclass(frozen=True)
class Plan:
    """One spine value's candidates ranked per C, best first."""

    spine: bool
    ranked: dict[int, list[Prediction]]

    def best(self, concurrency: int) -> Prediction:
        return self.ranked[concurrency][0]

    def runner_up(self, concurrency: int) -> Prediction | None:
        ranked = self.ranked[concurrency]
        return ranked[1] if len(ranked) > 1 else None

    def buckets(self) -> list[tuple[int, Config, list[int]]]:
        """(from batch size, config, the concurrencies it won): one per change of config, from 1 up.

        A bucket won at C starts at the geometric midpoint between the previous concurrency and C,
        not at C: C requests served in a closed loop run steps at C - 1 and below (between a
        request's finish and its successor's prefill, in the tail), and the step time grows about
        with log C, so a batch between two planned levels is served by the nearer one."""
        out: list[tuple[int, Config, list[int]]] = []
        levels = sorted(self.ranked)
        for previous, c in zip([None, *levels], levels):
            config = self.best(c).config
            if out and out[-1][1].token == config.token:
                out[-1][2].append(c)
            else:
                out.append((1 if not out else math.isqrt(previous * c - 1) + 1, config, [c]))
        return out

    def schedule(self) -> str:
        return ",".join(f"{start}:{config.token}" for start, config, _ in self.buckets())


def _rank_key(p: Prediction) -> tuple:
    # Ties go to the plain chain, then to the smaller tree: the same speed for less work.
    return (-p.tok_s, not p.config.dflash, p.config.shape.budget, p.config.shape.topk)


def plan(acceptance: dict[TreeShape, float], depth: int, costs: Costs, concurrencies: list[int], spine: bool,
         budgets: range) -> Plan:
    """Every shape of this spine with a budget in `budgets`, and the chain where DFLASH was measured."""
    shapes = [s for s in acceptance if s.spine == spine and s.budget in budgets]
    ranked = {}
    for c in concurrencies:
        found = [Prediction(Config(s), c, acceptance[s], costs.step_s(c, s.budget)) for s in shapes]
        if c in costs.chain:
            found.append(Prediction(Config(chain(depth), dflash=True), c, acceptance[chain(depth)], costs.chain[c]))
        ranked[c] = sorted(found, key=_rank_key)
    return Plan(spine=spine, ranked=ranked)


def shares(plans: list[Plan]) -> list[float]:
    """Per plan, the mean over C of its best tok/s as a share of the best any plan reaches at that C."""
    levels = sorted(plans[0].ranked)
    top = {c: max(p.best(c).tok_s for p in plans) for c in levels}
    return [sum(p.best(c).tok_s / top[c] for c in levels) / len(levels) for p in plans]


def choose(plans: list[Plan]) -> Plan:
    """The plan keeping the largest mean share of the best (one spine value serves every bucket);
    a tie keeps the spine, the shipped default."""
    return max(zip(shares(plans), plans), key=lambda pair: (pair[0], pair[1].spine))[1]
