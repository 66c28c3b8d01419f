"""ServerArgs helpers for the SGLang 0.5.17 tests: tiny model configs, the real CLI parser.

0.5.17 serves DFLASH on CUDA only (its DFLASH checks refuse another device), so the arguments
name --device cuda; parsing them needs no GPU."""

from __future__ import annotations

from server_args_support import QWEN3, parse  # noqa: F401  (the tests take both from here)


def cli(models, *extra):
    target, draft = models
    return ["--model-path", target, "--speculative-draft-model-path", draft, "--device", "cuda",
            "--skip-tokenizer-init", *extra]


def ddtree_cli(models, *extra):
    return cli(models, "--speculative-algorithm", "DDTREE", "--attention-backend", "triton", *extra)
