"""ServerArgs helpers for the SGLang 0.5.17 tests: tiny model configs, the real CLI parser.

0.5.17 serves DFLASH on CUDA only (its DFLASH checks refuse another device), so the arguments
name --device cuda; parsing them needs no GPU."""

from __future__ import annotations

import argparse

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 151936,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def parse(argv):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))


def cli(models, *extra):
    target, draft = models
    return ["--model-path", target, "--speculative-draft-model-path", draft, "--device", "cuda",
            "--skip-tokenizer-init", *extra]


def ddtree_cli(models, *extra):
    return cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton", *extra)
