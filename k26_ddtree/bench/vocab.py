"""The served model's vocabulary: how many token ids it has and which of them are special.

Token-id prompts must stay strictly inside it. The pinned SGLang does not check input_ids
against the vocabulary; the first id past its end kills the server on a device-side assert
(seen in set_mla_kv_buffer_triton, then SIGQUIT). Neither /model_info nor /server_info
carries the size, so it comes from --vocab-size, or from config.json in the server's
model_path when that folder is on this machine (read as SGLang reads it: the text
sub-config of a multimodal model; the smallest size either names). Special ids (bos, eos,
pad, the tokenizer's added tokens) are read from the same folder and avoided.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k26_ddtree import jsonread
from k26_ddtree.errors import UserError

TEXT_CONFIG_KEYS = ("thinker_config", "llm_config", "language_config", "text_config")  # SGLang's order
SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass(frozen=True)
class Vocabulary:
    size: int
    special_ids: frozenset[int]
    source: str  # where the size was learned, for the run record and for messages

    def describe(self) -> dict:
        return {"size": self.size, "source": self.source, "special_ids": len(self.special_ids)}


def _read_json(path: Path) -> dict:
    """The object in `path`; {} when the folder lacks it, a UserError when it is there but unreadable."""
    try:
        data = jsonread.read_json(path)
    except FileNotFoundError:
        return {}
    except jsonread.Unreadable as err:
        raise UserError(f"{err}: it is read to learn the served model's vocabulary") from None
    return data if isinstance(data, dict) else {}


def _configs(config: dict) -> list[dict]:
    """The top-level config and the text sub-config SGLang would use, if any."""
    found = [config]
    for key in TEXT_CONFIG_KEYS:
        sub = config.get(key)
        if isinstance(sub, dict):
            text = sub.get("text_config") if key == "thinker_config" else sub
            found.append(text if isinstance(text, dict) else sub)
            break
    return found


def _ints(value) -> set[int]:
    values = value if isinstance(value, list) else [value]
    return {v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def _special_ids(folders: list[Path], configs: list[dict]) -> frozenset[int]:
    ids: set[int] = set()
    for config in configs:
        for key in SPECIAL_ID_KEYS:
            ids |= _ints(config.get(key))
    for folder in folders:
        ids |= _ints(_read_json(folder / "generation_config.json").get("eos_token_id"))
        added = _read_json(folder / "tokenizer_config.json").get("added_tokens_decoder")
        if isinstance(added, dict):
            ids |= {int(key) for key in added if str(key).isdigit()}
    return frozenset(ids)


def _local_folder(value) -> Path | None:
    if isinstance(value, str) and value and Path(value).is_dir():
        return Path(value)
    return None


def served_vocabulary(explicit_size: int | None, model_info: dict, server_info: dict, url: str) -> Vocabulary:
    """The vocabulary of the model behind `url`; a UserError when it cannot be known."""
    model_path = model_info.get("model_path") or server_info.get("model_path")
    tokenizer_path = model_info.get("tokenizer_path") or server_info.get("tokenizer_path")
    model_dir = _local_folder(model_path)
    folders = [f for f in (model_dir, _local_folder(tokenizer_path)) if f is not None]
    configs = _configs(_read_json(model_dir / "config.json")) if model_dir else []
    sizes = [size for config in configs for size in _ints(config.get("vocab_size")) if size > 0]
    special = _special_ids(folders, configs)
    if explicit_size is not None:
        if sizes and explicit_size > min(sizes):
            raise UserError(f"--vocab-size {explicit_size} is more than the {min(sizes)} ids that "
                            f"{model_dir / 'config.json'} gives the served model")
        return Vocabulary(explicit_size, special, "--vocab-size")
    if not sizes:
        where = (f"{model_dir / 'config.json'} names no vocab_size" if model_dir
                 else f"its model_path {model_path!r} is not a folder on this machine")
        raise UserError(f"cannot tell how many token ids the model at {url} has ({where}): pass "
                        f"--vocab-size N, or --prompt-file for text prompts")
    return Vocabulary(min(sizes), special, str(model_dir / "config.json"))
