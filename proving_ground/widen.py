"""The widened target: the trained tiny target with a wider, slower MLP, same text.

Its verify cost is nearly flat in the step's tokens, unlike K2.6's MoE: proving_ground.emulator
models that cost instead.

On the tiny target a decode step is bound by host overhead (about 4 ms a step while the GPU
works about 0.5 ms), so its tok/s mostly measures Python; on K2.6 it is the verify's GPU
cost, which grows with the tokens verified. This widens the trained target, without training,
into a model that computes the same function with GPU work that grows like an MoE's:

  experts    each of the E trained experts is copied `copies` times into groups (group g holds
             copy g of every expert; noaux_tc's group limit, n_group = copies): top-k over the
             copies in topk_group groups picks topk_group copies of each of the original top-k,
             each weighted 1/topk_group of the original (the weights are normalised over the
             chosen), so the mix is the original's. A small jitter on each copy's gate row makes
             which groups win depend on the token, so a batch spreads over all E * copies experts
             (1 token reads topk * topk_group experts, 17 tokens most of them) at the price of
             routing weights within about the jitter of the original's.
  width      every expert's (and the shared expert's) intermediate size is zero-padded: the padded
             rows of gate/up and columns of down add matmul work and exactly nothing to the output.
  depth      `extra_layers` MoE layers are appended after the trained ones with random weights but
             zero o_proj and zero down projections: each does a full layer's work (MLA attention,
             routing over every expert, the expert matmuls) and adds exactly zero to the residual
             stream, so the drafter's context layers and the logits are the trained model's.

The drafters work unchanged with it (same hidden size, vocabulary and context layers). Its
greedy text differs from the tiny target's only where the jitter flips a near tie; every
proving-ground cell compares against this model's own AR reference.

    python -m proving_ground.widen --models DIR --out DIR [--extra-layers 45] [--copies 8]
        [--topk-group 4] [--moe-intermediate 2560] [--jitter 0.01] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path

import torch

from k26_ddtree.errors import UserError
from k26_ddtree.jsonread import read_json

INIT_STD = 0.02


# Always a new tensor: each expert copy must own its storage for safetensors.
def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def _pad_cols(t: torch.Tensor, cols: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(t.shape[0], cols - t.shape[1])], dim=1)


def widened_config(config: dict, extra_layers: int, copies: int, topk_group: int, moe_intermediate: int) -> dict:
    if config.get("n_group", 1) != 1:
        raise UserError("widen takes a target without group-limited routing (n_group 1)")
    if not 1 <= topk_group <= copies:
        raise UserError(f"--topk-group must be 1..--copies ({copies}), got {topk_group}")
    if moe_intermediate < config["moe_intermediate_size"]:
        raise UserError(f"--moe-intermediate {moe_intermediate} is below the target's {config['moe_intermediate_size']}")
    return dict(config, n_routed_experts=config["n_routed_experts"] * copies,
                num_experts_per_tok=config["num_experts_per_tok"] * topk_group, n_group=copies, topk_group=topk_group,
                moe_intermediate_size=moe_intermediate, num_hidden_layers=config["num_hidden_layers"] + extra_layers)


def _expert_tensors(prefix: str, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, width: int) -> dict:
    return {f"{prefix}.gate_proj.weight": _pad_rows(gate, width), f"{prefix}.up_proj.weight": _pad_rows(up, width),
            f"{prefix}.down_proj.weight": _pad_cols(down, width)}


def widen_layer(src: dict, layer: int, config: dict, wide: dict, jitter: float, gen: torch.Generator) -> dict:
    """A trained MoE layer's tensors, its experts copied into groups and padded."""
    p = f"model.layers.{layer}."
    out = {k: v for k, v in src.items() if k.startswith(p) and ".mlp." not in k}
    experts, copies, width = config["n_routed_experts"], wide["n_group"], wide["moe_intermediate_size"]
    gate = src[p + "mlp.gate.weight"]
    rows = []
    for copy in range(copies):
        noise = torch.randn(gate.shape, generator=gen, device=gate.device) * (jitter * gate.float().std())
        rows.append((gate.float() + (noise if copy else 0)).to(gate.dtype))
    out[p + "mlp.gate.weight"] = torch.cat(rows)
    out[p + "mlp.gate.e_score_correction_bias"] = src[p + "mlp.gate.e_score_correction_bias"].repeat(copies)
    for copy in range(copies):
        for e in range(experts):
            e_src = f"{p}mlp.experts.{e}"
            out.update(_expert_tensors(f"{p}mlp.experts.{copy * experts + e}", src[e_src + ".gate_proj.weight"],
                                       src[e_src + ".up_proj.weight"], src[e_src + ".down_proj.weight"], width))
    shared = p + "mlp.shared_experts"
    out.update(_expert_tensors(shared, src[shared + ".gate_proj.weight"], src[shared + ".up_proj.weight"],
                               src[shared + ".down_proj.weight"], width * wide.get("n_shared_experts", 1)))
    return out


def zero_layer(template: dict, template_layer: int, layer: int, gen: torch.Generator) -> dict:
    """A layer shaped like MoE layer `template_layer` of the widened tensors: random weights, ones
    for the norms, zeros where its output would reach the residual stream."""
    p, q = f"model.layers.{template_layer}.", f"model.layers.{layer}."
    out = {}
    for name, t in template.items():
        if not name.startswith(p):
            continue
        new = q + name[len(p):]
        if name.endswith("layernorm.weight"):
            out[new] = torch.ones_like(t)
        elif name.endswith(("o_proj.weight", "down_proj.weight", "e_score_correction_bias")):
            out[new] = torch.zeros_like(t)
        else:
            out[new] = (torch.randn(t.shape, generator=gen, device=t.device) * INIT_STD).to(t.dtype)
    return out


def widen(src: dict, config: dict, extra_layers: int, copies: int, topk_group: int, moe_intermediate: int,
          jitter: float, seed: int = 0) -> tuple[dict, dict]:
    """(tensors, config) of the widened target from the trained one's."""
    wide = widened_config(config, extra_layers, copies, topk_group, moe_intermediate)
    device = next(iter(src.values())).device
    gen = torch.Generator(device=device).manual_seed(seed)
    first_moe = config["first_k_dense_replace"]
    out = {k: v for k, v in src.items() if not k.startswith("model.layers.")}
    for layer in range(config["num_hidden_layers"]):
        if layer < first_moe:
            out.update({k: v for k, v in src.items() if k.startswith(f"model.layers.{layer}.")})
        else:
            out.update(widen_layer(src, layer, config, wide, jitter, gen))
    last = config["num_hidden_layers"] - 1
    for layer in range(config["num_hidden_layers"], wide["num_hidden_layers"]):
        out.update(zero_layer(out, last, layer, gen))
    return out, wide


def write_model(models: Path, out: Path, extra_layers: int, copies: int, topk_group: int, moe_intermediate: int,
                jitter: float, device: str) -> dict:
    """OUT/target (the widened checkpoint) beside links to MODELS' drafters, prompts and reports."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    target = models / "target"
    if out.resolve() == models.resolve():
        # out/target would replace the trained target it is read from.
        raise UserError(f"--out {out} is the --models folder: give a new folder")
    try:
        config = read_json(target / "config.json")
        if not isinstance(config, dict):
            raise ValueError("config.json is not an object")
        src = load_file(str(target / "model.safetensors"), device=device)
        tensors, wide = widen(src, config, extra_layers, copies, topk_group, moe_intermediate, jitter)
    except (OSError, ValueError, TypeError, SafetensorError) as err:
        raise UserError(f"{target}: not a tiny target checkpoint ({err})") from None
    except KeyError as err:  # a config key or tensor a tiny target has
        raise UserError(f"{target}: not a tiny target checkpoint (no {err})") from None
    out.mkdir(parents=True, exist_ok=True)
    for entry in models.iterdir():
        if entry.name != "target" and not (out / entry.name).exists():
            os.symlink(entry.resolve(), out / entry.name)
    wide_dir = out / "target"
    tmp = out / "target.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in target.iterdir():
        if name.name not in ("model.safetensors", "config.json"):
            shutil.copyfile(name, tmp / name.name)
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(wide, indent=1) + "\n")
    shutil.rmtree(wide_dir, ignore_errors=True)
    tmp.replace(wide_dir)
    params = sum(t.numel() for t in tensors.values())
    return {"layers": wide["num_hidden_layers"], "experts": wide["n_routed_experts"],
            "experts_per_token": wide["num_experts_per_tok"], "groups": [wide["n_group"], wide["topk_group"]],
            "moe_intermediate": moe_intermediate, "jitter": jitter, "params": params,
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving_ground.widen", description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="the trained pair's folder (target/, drafters)")
    parser.add_argument("--out", type=Path, required=True, help="new folder: target/ widened, the rest linked")
    parser.add_argument("--extra-layers", type=int, default=45, help="zero-output MoE layers appended (default 45)")
    parser.add_argument("--copies", type=int, default=8, help="copies of each expert, one group each (default 8)")
    parser.add_argument("--topk-group", type=int, default=4, help="groups each token routes to (default 4)")
    parser.add_argument("--moe-intermediate", type=int, default=2560, help="expert width after padding (default 2560)")
    parser.add_argument("--jitter", type=float, default=0.01, help="gate-row jitter per copy, in the gate's std")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.extra_layers < 0 or args.copies < 1:
        print("widen: error: --extra-layers must be >= 0 and --copies >= 1", file=sys.stderr)
        return 2
    if not 0 <= args.jitter < math.inf:  # NaN fails this too; it would make every gate row NaN
        print(f"widen: error: --jitter must be a finite number >= 0, got {args.jitter}", file=sys.stderr)
        return 2
    try:
        report = write_model(args.models, args.out, args.extra_layers, args.copies, args.topk_group,
                             args.moe_intermediate, args.jitter, args.device)
    except UserError as err:
        print(f"widen: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # --out a file, or under one, or not writable
        print(f"widen: error: cannot write {args.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    (args.out / "widen_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
