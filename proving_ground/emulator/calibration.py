"""What one step of Kimi K2.6 costs one GPU rank of a real box, fitted to the field's figures.

A step verifies T tokens for each of B requests (N = B·T tokens; T = 1 is a plain decode) over
contexts ctx_1..ctx_B. On one rank it costs, in µs:

    fixed                                        fitted: dense weight reads, all-reduces, launches
  + 60 · (moe_layer + expert · slices(N_eff) + pair · 8N)      the routed experts of the 60 MoE layers
  + dense_per_token · N                          the dense matmuls' compute beyond their weight reads
  + (attn_ctx · Σ ctx_i + attn_query_ctx · Σ q_i·ctx_i) / 1000   MLA over the KV cache (q_i = T)
  + draft + draft_per_request · B                only in a verify step: the DFlash drafter's forward

The MoE term is the field's Marlin measurement on one H200 holding a TP8 slice (384 experts, width
256), refitted here with a compute term: t(N) = a + b · distinct(N) + c · 8N per layer. `slices` is
how many TP8-slice-sized expert reads the busiest rank makes: on TP8 every rank reads a slice of
each distinct expert, 384·(1 − (1 − 8/384)^N_eff); on EP8 a rank holds 48 whole experts (8 slices
each) and the step waits for the busiest rank. Routing correlation ρ acts inside a request (its T
tokens share context): N_eff = B · T^(1 − κρ), with κ fitted to the field's ρ = 0.5 layer figures.

Per box two constants are fitted, `fixed` and `expert`, on two figures only, so that the fit
cannot decide the answer (PCIe: AR and linear DFlash at C=1; B300: AR and b8/k4 at C=1);
everything else is stated from the hardware and K2.6's shapes (below, each with why). Every other field figure is a prediction.

    python -m proving_ground.emulator.calibration --box pcie-ep8 [--rho R]
    python -m proving_ground.emulator.calibration --markdown     (boxes/CALIBRATION.md)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

BOXES = Path(__file__).resolve().parent / "boxes"
MODES = ("decode", "target_verify", "extend")

# --- The field's H200 measurement of one K2.6 int4 MoE layer (field-facts.md) ---
# (N tokens, fused_marlin_moe µs) for a TP8 slice: 384 experts, top-8, hidden 7168, width 256.
H200_MARLIN_US = ((1, 32.0), (2, 40.4), (4, 57.9), (8, 88.3), (9, 94.3), (17, 145.8), (33, 230.8),
                  (65, 326.8), (128, 414.7))
# The same layer with correlated routing, ρ = 0.5: (N, µs).
H200_RHO05_US = ((9, 73.0), (17, 96.0), (33, 129.0), (65, 185.0))
H200_TB_S, H200_TFLOPS = 4.8, 989.0  # HBM3e bandwidth and dense bf16 peak

# --- Kimi K2.6 shapes (field-facts.md) ---
EXPERTS, TOPK, GPUS = 384, 8, 8
LAYERS, MOE_LAYERS = 61, 60
HEADS_PER_GPU = 64 // GPUS  # attention is tensor-parallel on every layout
MLA_KV_BYTES = (512 + 64) * 2  # bf16 latent + rope key per context token per layer
MLA_QUERY_FLOPS = HEADS_PER_GPU * (576 + 512) * 2  # absorbed MLA: q·k over 576 dims, p·v over 512
ROUTED_PARAMS = TOPK * 3 * 7168 * 2048 * MOE_LAYERS
EMBED_PARAMS = 163840 * 7168
# Active params outside the routed experts and the embedding lookup (attention, shared experts,
# the dense first layer, lm_head), split over 8 ranks: 2 flops per param per token.
DENSE_FLOPS_PER_TOKEN = 2 * (32e9 - ROUTED_PARAMS - EMBED_PARAMS) / GPUS
# The DFlash drafter: 6.5 GB of bf16 weights plus the target's lm_head (bf16) for its 7 rows.
DRAFT_BYTES = (6.5e9 + 2 * EMBED_PARAMS) / GPUS
DRAFT_FLOPS_PER_REQUEST = 2 * (6.5e9 / 2 * 8 + EMBED_PARAMS * 7) / GPUS
DRAFT_ALLREDUCES = 6 * 2 + 1  # two per layer, one for the vocab-sharded argmax

# --- Efficiencies, stated (no figure here measures them) ---
ATTN_MEM_EFF = 0.5  # a triton MLA decode kernel streams the KV cache at about half of peak
ATTN_FLOP_EFF = 0.3  # and reaches about a third of the tensor-core peak on the score/value math
DENSE_FLOP_EFF = 0.6  # large dense GEMMs
DRAFT_MEM_EFF = 0.7  # the drafter's weight reads at batch 1


def _lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    a = torch.tensor(rows, dtype=torch.float64)
    return torch.linalg.lstsq(a, torch.tensor(ys, dtype=torch.float64).unsqueeze(1)).solution.squeeze(1).tolist()


def distinct(n_eff: float) -> float:
    """Expected distinct experts among 384 touched by n_eff independently routed tokens (top-8)."""
    return EXPERTS * (1 - (1 - TOPK / EXPERTS) ** n_eff)


# a, b, c of the H200 layer: µs per layer, per distinct expert slice, per token-expert pair.
MARLIN_A, MARLIN_B, MARLIN_C = _lstsq([[1.0, distinct(n), TOPK * n] for n, _ in H200_MARLIN_US],
                                      [t for _, t in H200_MARLIN_US])


def h200_layer_us(n_eff: float, n_tokens: float) -> float:
    return MARLIN_A + MARLIN_B * distinct(n_eff) + MARLIN_C * TOPK * n_tokens


def _fit_kappa() -> float:
    """κ in N_eff = N^(1 − κρ) from the field's ρ = 0.5 layer times (least squares in log N)."""
    sxy = sxx = 0.0
    for n, t in H200_RHO05_US:
        share = (t - MARLIN_A - MARLIN_C * TOPK * n) / MARLIN_B / EXPERTS
        n_eff = math.log(1 - share) / math.log(1 - TOPK / EXPERTS)
        sxy += math.log(n) * math.log(n_eff)
        sxx += math.log(n) ** 2
    return (1 - sxy / sxx) / 0.5


KAPPA = _fit_kappa()


def effective_tokens(tokens_per_request: float, batch: int, rho: float) -> float:
    return batch * tokens_per_request ** (1 - KAPPA * rho)


def _expected_max_binomial(n: int, p: float, k: int) -> float:
    """E[max of k independent Binomial(n, p)] = Σ_j P(max > j)."""
    cdf, total = 0.0, 0.0
    for j in range(n):
        cdf += math.comb(n, j) * p ** j * (1 - p) ** (n - j)
        total += 1 - min(cdf, 1.0) ** k
    return total


def expert_slices(n_eff: float, layout: str) -> float:
    """TP8-slice-sized expert reads the busiest rank makes in one MoE layer."""
    touched = 1 - (1 - TOPK / EXPERTS) ** n_eff
    if layout == "tp":
        return EXPERTS * touched
    # EP8: each expert is touched with probability `touched` (independence across experts is the
    # approximation); a whole expert is GPUS slices, and the layer ends with the busiest rank.
    return GPUS * _expected_max_binomial(EXPERTS // GPUS, touched, GPUS)


@dataclass(frozen=True)
class Costs:
    """One box's step-cost constants: what an emulated folder's config.json carries (k26_emulator)."""

    box: str
    layout: str  # "tp" (each rank a slice of every expert) or "ep" (48 whole experts a rank)
    rho: float  # routing correlation inside a request
    fixed_us: float  # fitted
    expert_us: float  # fitted: per TP8-slice expert read per MoE layer
    moe_layer_us: float
    pair_us: float  # per token-expert pair per MoE layer
    dense_us_per_token: float
    attn_ns_per_ctx_token: float
    attn_ns_per_query_ctx_token: float
    draft_us: float
    draft_us_per_request: float

    def static_us(self, mode: str, n_tokens: int, batch: int) -> float:
        """The part of a step fixed by its shape (static per CUDA graph): all but attention."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is none of {MODES}")
        if n_tokens < 1 or batch < 1:
            return 0.0
        n_eff = effective_tokens(n_tokens / batch, batch, self.rho)
        moe = MOE_LAYERS * (self.moe_layer_us + self.expert_us * expert_slices(n_eff, self.layout)
                            + self.pair_us * TOPK * n_tokens)
        draft = self.draft_us + self.draft_us_per_request * batch if mode == "target_verify" else 0.0
        return self.fixed_us + moe + self.dense_us_per_token * n_tokens + draft

    def step_us(self, mode: str, n_tokens: int, batch: int, seq_lens: list[int],
                queries: list[int] | None = None) -> float:
        """The whole step; queries[i] = request i's tokens in the step (default n_tokens / batch)."""
        q = queries if queries is not None else [n_tokens / batch] * len(seq_lens)
        attn_ns = (self.attn_ns_per_ctx_token * sum(seq_lens)
                   + self.attn_ns_per_query_ctx_token * sum(a * b for a, b in zip(q, seq_lens)))
        return self.static_us(mode, n_tokens, batch) + attn_ns / 1000

    def tok_s(self, tokens_per_request: int, concurrency: int, acceptance: float, context: int) -> float:
        mode = "decode" if tokens_per_request == 1 else "target_verify"
        step = self.step_us(mode, tokens_per_request * concurrency, concurrency, [context] * concurrency)
        return concurrency * acceptance / step * 1e6

    def to_block(self) -> dict:
        return asdict(self)

    @classmethod
    def from_block(cls, block: dict) -> "Costs":
        return cls(**{k: block[k] for k in cls.__dataclass_fields__})


class CalibrationError(ValueError):
    """A box file that cannot be read or fitted."""


def box_names() -> list[str]:
    return sorted(p.stem for p in BOXES.glob("*.json"))


def read_box(name: str) -> dict:
    path = BOXES / f"{name}.json"
    if not path.is_file():
        raise CalibrationError(f"no box {name!r} (boxes: {', '.join(box_names())})")
    return json.loads(path.read_text())


def stated(box: dict, rho: float | None = None) -> Costs:
    """The box's costs with everything but the two fitted constants (left 0) stated from hardware."""
    hw = box["hardware"]
    tb_s, tflops = hw["hbm_tb_s"], hw["bf16_tflops"]
    return Costs(
        box=box["name"], layout=box["layout"], rho=box["rho"] if rho is None else rho,
        fixed_us=0.0, expert_us=0.0,
        # The per-layer constant of the H200 fit is launches and routing bookkeeping, not bytes.
        moe_layer_us=MARLIN_A,
        # Per-pair work is tensor-core math: it scales with the bf16 peak.
        pair_us=MARLIN_C * H200_TFLOPS / tflops,
        dense_us_per_token=DENSE_FLOPS_PER_TOKEN / (tflops * 1e12 * DENSE_FLOP_EFF) * 1e6,
        attn_ns_per_ctx_token=LAYERS * MLA_KV_BYTES / (tb_s * 1e12 * ATTN_MEM_EFF) * 1e9,
        attn_ns_per_query_ctx_token=LAYERS * MLA_QUERY_FLOPS / (tflops * 1e12 * ATTN_FLOP_EFF) * 1e9,
        draft_us=DRAFT_BYTES / (tb_s * 1e12 * DRAFT_MEM_EFF) * 1e6 + DRAFT_ALLREDUCES * hw["allreduce_us"],
        draft_us_per_request=DRAFT_FLOPS_PER_REQUEST / (tflops * 1e12 * DENSE_FLOP_EFF) * 1e6,
    )


def _point_step_us(costs: Costs, point: dict, context: int) -> float:
    t, c = point["tokens"], point["concurrency"]
    mode = "decode" if t == 1 else "target_verify"
    return costs.step_us(mode, t * c, c, [context] * c)


def fit(box: dict, rho: float | None = None) -> Costs:
    """Solve fixed_us and expert_us so that the box's two fit points come out at the field's tok/s."""
    base = stated(box, rho)
    unit = replace(base, expert_us=1.0)
    ctx = box["context_tokens"]
    rows, rhs = [], []
    for point in box["fit"]:
        step = point["concurrency"] * point["acceptance"] / point["field_tok_s"] * 1e6
        rest = _point_step_us(base, point, ctx)
        rows.append([1.0, _point_step_us(unit, point, ctx) - rest])
        rhs.append(step - rest)
    if len(rows) != 2:
        raise CalibrationError(f"box {box['name']}: needs exactly two fit points, has {len(rows)}")
    (f1, x1), (f2, x2) = rows
    expert = (rhs[1] - rhs[0]) / (x2 - x1)
    fixed = rhs[0] - expert * x1
    if expert <= 0 or fixed <= 0:
        raise CalibrationError(f"box {box['name']}: the fit points give fixed {fixed:.0f} µs, expert {expert:.3f} µs:"
                               " no positive costs reproduce them")
    return replace(base, fixed_us=fixed, expert_us=expert)


def load(name: str, rho: float | None = None) -> Costs:
    return fit(read_box(name), rho)


# --- Reports ---

def _err(pred: float, field: float) -> float:
    """Percent error, rounded to the 0.01 % the table shows, so that a fitted point's last-bit
    residue cannot print as -0.0 on one machine and +0.0 on another."""
    return round((pred / field - 1) * 100, 2) + 0.0


def rows(box: dict, costs: Costs) -> list[dict]:
    """Every fit point and prediction: tok/s predicted, the field's, the error and whether it passes."""
    out = []
    for kind, points in (("fitted", box["fit"]), ("predicted", box["predict"])):
        for p in points:
            pred = costs.tok_s(p["tokens"], p["concurrency"], p["acceptance"], box["context_tokens"])
            err = _err(pred, p["field_tok_s"])
            out.append({"kind": kind, "label": p["label"], "tokens": p["tokens"], "concurrency": p["concurrency"],
                        "acceptance": p["acceptance"], "step_ms": p["concurrency"] * p["acceptance"] / pred * 1e3,
                        "tok_s": pred, "field_tok_s": p["field_tok_s"], "error_pct": err,
                        "within_15": abs(err) <= 15, "match_acceptance": p["acceptance"] * p["field_tok_s"] / pred,
                        "note": p.get("note", "")})
    return out


def _constant_lines(box: dict, costs: Costs) -> list[tuple[str, str, str]]:
    hw = box["hardware"]
    return [
        ("fixed_us", f"{costs.fixed_us:.0f}", "fitted"),
        ("expert_us", f"{costs.expert_us:.3f}", f"fitted (H200: {MARLIN_B:.3f}; bytes alone would give"
                                                 f" {MARLIN_B * H200_TB_S / hw['hbm_tb_s']:.3f})"),
        ("moe_layer_us", f"{costs.moe_layer_us:.1f}", "stated: the H200 layer's constant"),
        ("pair_us", f"{costs.pair_us:.4f}", f"stated: H200 {MARLIN_C:.4f} × bf16 peak ratio"),
        ("dense_us_per_token", f"{costs.dense_us_per_token:.2f}", "stated: dense flops at 60 % of peak"),
        ("attn_ns_per_ctx_token", f"{costs.attn_ns_per_ctx_token:.1f}", "stated: MLA KV bytes at 50 % of HBM"),
        ("attn_ns_per_query_ctx_token", f"{costs.attn_ns_per_query_ctx_token:.2f}",
         "stated: MLA flops at 30 % of peak"),
        ("draft_us", f"{costs.draft_us:.0f}", "stated: drafter + lm_head bytes at 70 % of HBM, 13 all-reduces"),
        ("draft_us_per_request", f"{costs.draft_us_per_request:.1f}", "stated: drafter flops at 60 % of peak"),
        ("rho", f"{costs.rho:g}", "stated"),
    ]


def reference_lines() -> list[str]:
    """How the H200 layer model reproduces the field's layer measurements."""
    out = [f"H200 layer refit: a {MARLIN_A:.2f} µs + b {MARLIN_B:.4f} µs/distinct expert + c {MARLIN_C:.4f}"
           f" µs/token-expert pair; κ {KAPPA:.3f}"]
    out.append("  ρ=0: " + ", ".join(f"N={n} {h200_layer_us(n, n):.1f} ({_err(h200_layer_us(n, n), t):+.1f} %)"
                                      for n, t in H200_MARLIN_US))
    out.append("  ρ=0.5: " + ", ".join(
        f"N={n} {h200_layer_us(effective_tokens(n, 1, 0.5), n):.1f} "
        f"({_err(h200_layer_us(effective_tokens(n, 1, 0.5), n), t):+.1f} %)" for n, t in H200_RHO05_US))
    return out


def text_table(box: dict, costs: Costs) -> str:
    lines = [f"box {box['name']}: {box['describes']}", f"layout {costs.layout}, context {box['context_tokens']}"
             f" tokens a request, ρ {costs.rho:g}", ""]
    lines += [f"{name:28s} {value:>10s}  {why}" for name, value, why in _constant_lines(box, costs)]
    lines.append("")
    lines.append(f"{'':10s} {'config':16s} {'T':>3s} {'C':>4s} {'acc':>5s} {'step ms':>8s} {'tok/s':>8s}"
                 f" {'field':>7s} {'error':>8s} {'acc to match':>12s}")
    for r in rows(box, costs):
        verdict = "" if r["kind"] == "fitted" else ("within ±15 %" if r["within_15"] else "OUTSIDE ±15 %")
        lines.append(f"{r['kind']:10s} {r['label']:16s} {r['tokens']:3d} {r['concurrency']:4d} {r['acceptance']:5.2f}"
                     f" {r['step_ms']:8.2f} {r['tok_s']:8.1f} {r['field_tok_s']:7g} {r['error_pct']:+7.1f}%"
                     f" {r['match_acceptance']:12.2f} {verdict}")
    lines.append("")
    lines += reference_lines()
    return "\n".join(lines)


def _markdown_box(box: dict, costs: Costs) -> list[str]:
    out = ["| constant | value | how |", "|---|---|---|"]
    out += [f"| `{n}` | {v} | {w} |" for n, v, w in _constant_lines(box, costs)]
    out += ["", "| | config | T | C | acceptance | step ms | tok/s | field | error | ±15 % | acceptance to match |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows(box, costs):
        verdict = "fit" if r["kind"] == "fitted" else ("yes" if r["within_15"] else "**no**")
        out.append(f"| {r['kind']} | {r['label']} | {r['tokens']} | {r['concurrency']} | {r['acceptance']:.2f} |"
                   f" {r['step_ms']:.2f} | {r['tok_s']:.1f} | {r['field_tok_s']:g} | {r['error_pct']:+.1f} % |"
                   f" {verdict} | {r['match_acceptance']:.2f} |")
    return out


def markdown() -> str:
    """boxes/CALIBRATION.md: every box at its stated ρ, then at ρ = 0.5, with the box's notes."""
    out = [(BOXES / "CALIBRATION.head.md").read_text().rstrip(), ""]
    for name in box_names():
        box = read_box(name)
        out += [f"## {name}", "", box["describes"], "",
                f"Layout `{box['layout']}`; context {box['context_tokens']} tokens a request.", ""]
        out += _markdown_box(box, fit(box))
        out += ["", f"At ρ = 0.5 (sensitivity; the box states ρ = {box['rho']:g}):", ""]
        try:
            out += _markdown_box(box, fit(box, 0.5))
        except CalibrationError as err:  # a finding, not a failure: the figures rule this ρ out
            out.append(f"No fit: {err}.")
        out += [""] + [f"- {note}" for note in box["notes"]] + [""]
    out += ["## The H200 layer model against the field's layer measurements", ""]
    out += ["    " + line for line in reference_lines()] + [""]
    return "\n".join(out)


class OneLineParser(argparse.ArgumentParser):
    """argparse that answers bad input with one line and exit status 2."""

    def error(self, message: str) -> None:  # noqa: D401
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m proving_ground.emulator.calibration",
                           description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--box", help=f"a box file's name under {BOXES.name}/")
    what.add_argument("--markdown", action="store_true", help="print boxes/CALIBRATION.md for every box")
    parser.add_argument("--rho", type=float, help="routing correlation in 0..1 (default: the box's)")
    args = parser.parse_args(argv)
    if args.rho is not None and not 0 <= args.rho <= 1:
        parser.error(f"--rho must be in 0..1, got {args.rho}")
    if args.markdown and args.rho is not None:
        parser.error("--rho goes with --box")
    try:
        if args.markdown:
            print(markdown(), end="")
        else:
            box = read_box(args.box)
            print(text_table(box, fit(box, args.rho)))
    except CalibrationError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
