"""The proving-ground model pair: a tiny DeepseekV3 target and its DFlash drafter, in plain torch.

The modules compute what SGLang 0.5.11 runs for these checkpoints
(`srt/models/deepseek_v2.py` for the target, `srt/models/dflash.py` plus the
context-KV materialisation in `dflash_worker.py` for the drafter), so a model
trained here keeps its margins when SGLang serves it. Parameter names are the
checkpoint names SGLang's loaders expect.

Target: MLA with q_lora and kv_lora and interleaved (GPT-J style) RoPE on the
rope half, one dense first layer, then MoE layers with sigmoid `noaux_tc`
gating (+ `e_score_correction_bias`), routed and shared experts.
Drafter: Qwen3-style layers over [target context K/V ; block], non-causal in
the block; context features = concat of the target's residual stream after
`target_layer_ids`, through `fc` and `hidden_norm`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 2048
HIDDEN = 256
BLOCK_SIZE = 8
MASK_TOKEN_ID = 2
TARGET_LAYER_IDS = [0, 1]
MAX_POSITIONS = 4096

TARGET_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 128,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rope_interleave": True,
    "max_position_embeddings": MAX_POSITIONS,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}

# rope_theta 1e6 is also what dflash.py falls back to: transformers 5.x moves
# rope_theta into rope_parameters, so `getattr(config, "rope_theta", 1e6)` there
# never sees the value written here. Writing the fallback keeps both readings equal.
DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": MAX_POSITIONS,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "num_target_layers": TARGET_CONFIG["num_hidden_layers"],
    "block_size": BLOCK_SIZE,
    "dflash_config": {
        "target_layer_ids": TARGET_LAYER_IDS,
        "mask_token": "<|MASK|>",
        "mask_token_id": MASK_TOKEN_ID,
        "block_size": BLOCK_SIZE,
    },
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float):
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    freqs = positions.float()[..., None] * inv_freq
    return freqs.cos(), freqs.sin()


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J style: rotate pairs (2i, 2i+1). x [..., T, heads, dim]; cos/sin [..., T, dim/2]."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    c, s = cos[..., None, :], sin[..., None, :]
    out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return out.flatten(-2).to(x.dtype)


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX style: rotate halves. x [..., T, heads, dim]; cos/sin [..., T, dim/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    c, s = cos[..., None, :], sin[..., None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MLAttention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.heads = c["num_attention_heads"]
        self.nope, self.rope, self.v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.kv_lora = c["kv_lora_rank"]
        self.theta = c["rope_theta"]
        h = c["hidden_size"]
        self.q_a_proj = nn.Linear(h, c["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"])
        self.q_b_proj = nn.Linear(c["q_lora_rank"], self.heads * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.heads * (self.nope + self.v), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v, h, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, t, self.heads, -1)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, t, self.heads, -1)
        k_nope, v = kv.split([self.nope, self.v], dim=-1)
        cos, sin = rope_cos_sin(positions, self.rope, self.theta)
        q_pe = rope_interleaved(q_pe, cos, sin)
        k_pe = rope_interleaved(k_pe.view(b, t, 1, self.rope), cos, sin).expand(b, t, self.heads, self.rope)
        q = torch.cat((q_nope, q_pe), dim=-1).transpose(1, 2)
        k = torch.cat((k_nope, k_pe), dim=-1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True,
                                             scale=(self.nope + self.rope) ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Gate(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        # Zeros, not torch.empty: a target built without init_weights must still give finite
        # logits; init_weights draws it like every other matrix, and zeros draw no random numbers.
        self.weight = nn.Parameter(torch.zeros(c["n_routed_experts"], c["hidden_size"]))
        # Fixed (not trained), non-zero so the bias path of noaux_tc routing is exercised.
        self.register_buffer("e_score_correction_bias", torch.zeros(c["n_routed_experts"]))


class MoE(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.top_k = c["num_experts_per_tok"]
        self.scale = c["routed_scaling_factor"]
        self.n_group, self.topk_group = c["n_group"], c["topk_group"]
        self.gate = Gate(c)
        self.experts = nn.ModuleList(
            MLP(c["hidden_size"], c["moe_intermediate_size"]) for _ in range(c["n_routed_experts"])
        )
        self.shared_experts = MLP(c["hidden_size"], c["moe_intermediate_size"] * c["n_shared_experts"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Routing in fp32 whatever the autocast: SGLang's gate and top-k kernels work in fp32.
        with torch.autocast(x.device.type, enabled=False):
            scores = F.linear(x.float(), self.gate.weight.float()).sigmoid()
            choice = scores + self.gate.e_score_correction_bias.float()
            if self.n_group > 1:
                choice = group_limited(choice, self.n_group, self.topk_group)
            top_ids = choice.topk(self.top_k, dim=-1).indices
            top_w = scores.gather(-1, top_ids)
            top_w = top_w / top_w.sum(-1, keepdim=True) * self.scale
            dense_w = torch.zeros_like(scores).scatter(-1, top_ids, top_w)
        # Every expert on every token: at this size a dense mix is cheaper than dispatch.
        routed = sum(dense_w[..., e:e + 1].to(x.dtype) * expert(x) for e, expert in enumerate(self.experts))
        return routed + self.shared_experts(x)


def group_limited(choice: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """noaux_tc's group limit, as SGLang's biased_grouped_topk: each group scores the sum of its two
    best biased scores, and the experts outside the topk_group best groups are never chosen."""
    groups = choice.view(*choice.shape[:-1], n_group, -1)
    best = groups.topk(2, dim=-1).values.sum(-1).topk(topk_group, dim=-1).indices
    keep = torch.zeros_like(groups[..., 0]).scatter(-1, best, 1.0).unsqueeze(-1).expand_as(groups)
    return groups.masked_fill(keep == 0, float("-inf")).view_as(choice)


class TargetLayer(nn.Module):
    def __init__(self, c: dict, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"])
        self.self_attn = MLAttention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"])
        dense = layer_id < c["first_k_dense_replace"]
        self.mlp = MLP(c["hidden_size"], c["intermediate_size"]) if dense else MoE(c)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class TargetBody(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(TargetLayer(c, i) for i in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"])


class TinyDeepseekV3(nn.Module):
    """forward(ids) -> (logits, context features for the drafter)."""

    def __init__(self, c: dict = TARGET_CONFIG, capture_layer_ids=TARGET_LAYER_IDS):
        super().__init__()
        self.model = TargetBody(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.capture_layer_ids = list(capture_layer_ids)

    def forward(self, ids: torch.Tensor):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.model.embed_tokens(ids)
        captured = []
        for i, layer in enumerate(self.model.layers):
            x = layer(x, positions)
            if i in self.capture_layer_ids:
                captured.append(x)
        return self.lm_head(self.model.norm(x)).float(), torch.cat(captured, dim=-1)


class DraftAttention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.heads, self.kv_heads, self.dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.heads * self.dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.dim, h, bias=False)
        self.q_norm = RMSNorm(self.dim)
        self.k_norm = RMSNorm(self.dim)
        self.theta = c["rope_theta"]

    def keys_values(self, x, cos, sin):
        b, t, _ = x.shape
        k = rope_neox(self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.dim)), cos, sin)
        return k, self.v_proj(x).view(b, t, self.kv_heads, self.dim)

    def forward(self, block, ctx, block_cos, block_sin, ctx_cos, ctx_sin, mask):
        """block [B, Q, H] queries; ctx [B, C, H] context features; mask [B, Q, C+Q] bool."""
        b, q_len, _ = block.shape
        q = rope_neox(self.q_norm(self.q_proj(block).view(b, q_len, self.heads, self.dim)), block_cos, block_sin)
        k_ctx, v_ctx = self.keys_values(ctx, ctx_cos, ctx_sin)
        k_blk, v_blk = self.keys_values(block, block_cos, block_sin)
        k = torch.cat((k_ctx, k_blk), dim=1).transpose(1, 2)
        v = torch.cat((v_ctx, v_blk), dim=1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None],
                                             enable_gqa=True, scale=self.dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DraftLayer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"])
        self.self_attn = DraftAttention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"])
        self.mlp = MLP(c["hidden_size"], c["intermediate_size"])

class TinyDFlashDrafter(nn.Module):
    """forward(block_embeds, ctx_features, ...) -> final-normed hidden states of the block.

    Context K/V come from `hidden_norm(fc(features))` WITHOUT the layer's input
    norm (dflash_worker `_append_target_hidden_sequential`); block tokens run the
    usual pre-norm layer. The target's lm_head turns the result into logits.
    """

    def __init__(self, c: dict = DRAFT_CONFIG):
        super().__init__()
        n_feat = len(c["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(n_feat * c["hidden_size"], c["hidden_size"], bias=False)
        self.hidden_norm = RMSNorm(c["hidden_size"])
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"])
        self.theta = c["rope_theta"]
        self.head_dim = c["head_dim"]

    def forward(self, block_embeds, block_pos, ctx_features, ctx_pos, mask):
        ctx = self.hidden_norm(self.fc(ctx_features))
        bc, bs = rope_cos_sin(block_pos, self.head_dim, self.theta)
        cc, cs = rope_cos_sin(ctx_pos, self.head_dim, self.theta)
        x = block_embeds
        for layer in self.layers:
            x = x + layer.self_attn(layer.input_layernorm(x), ctx, bc, bs, cc, cs, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def init_weights(module: nn.Module, seed: int, std: float = 0.02) -> None:
    """Seeded normal init for linears/embeddings (norms stay at one)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(module.named_parameters()):
        if p.dim() >= 2:
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    for name, buf in sorted(module.named_buffers()):
        if name.endswith("e_score_correction_bias"):
            buf.copy_(torch.randn(buf.shape, generator=gen) * 0.01)


def out_proj_scale(module: nn.Module, n_layers: int) -> None:
    """GPT-2 style smaller init for residual outputs: keeps early training stable."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(1.0 / math.sqrt(2 * n_layers))


def save_checkpoint(module: nn.Module, config: dict, out_dir: Path) -> None:
    """config.json + model.safetensors in bf16 (the correction bias stays fp32, as in real checkpoints)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in list(module.state_dict().items()):
        keep_fp32 = name.endswith("e_score_correction_bias")
        tensors[name] = t.detach().to("cpu", torch.float32 if keep_fp32 else torch.bfloat16).contiguous()
    tmp = out_dir / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(json.dumps(config, indent=1) + "\n")
