"""A byte-level BPE tokenizer built locally (no downloads) whose vocab is exactly the model's.

Ids 0/1/2 are bos/eos/mask: the DFlash drafter's `mask_token_id` 2 must name
`<|MASK|>` in this vocab, or SGLang's DFlash worker refuses the pair.
"""

from __future__ import annotations

import json
from pathlib import Path

BOS, EOS, MASK = "<|bos|>", "<|eos|>", "<|MASK|>"
SPECIAL_TOKENS = (BOS, EOS, MASK)


def build_tokenizer(lines: list[str], vocab_size: int):
    """Train a byte-level BPE on `lines`; pad with reserved tokens up to `vocab_size` exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    missing = vocab_size - tok.get_vocab_size()
    if missing < 0:
        raise RuntimeError(f"tokenizer grew past the model vocab: {tok.get_vocab_size()} > {vocab_size}")
    tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(token) != expected_id:
            raise RuntimeError(f"{token} landed on id {tok.token_to_id(token)}, not {expected_id}")
    return tok


def save_tokenizer(tok, out_dir: Path, max_len: int) -> None:
    """tokenizer.json plus the config transformers' AutoTokenizer needs to load it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": None,
        "pad_token": EOS,
        "model_max_length": max_len,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}, indent=1) + "\n"
    )
