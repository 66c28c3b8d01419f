"""Benchmark prompts: token-id prompts of an exact length, or windows of a local text file.

Token-id prompts follow the pinned SGLang's `random-ids` dataset: each prompt
is a run of consecutive ids from a random offset, wrapped into a safe id
range, so no tokenizer and no download are needed and the length is exact.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.errors import UserError

# Low ids hold special and control tokens in most vocabularies; the top of
# Kimi's vocabulary (163584+) holds its chat markers. Stay between them.
DEFAULT_ID_LOW = 1000
DEFAULT_ID_HIGH = 30000


@dataclass(frozen=True)
class PromptSource:
    """Where prompts come from; `describe()` goes into the run JSON."""

    seed: int
    id_low: int = DEFAULT_ID_LOW
    id_high: int = DEFAULT_ID_HIGH
    text_file: Path | None = None
    tokenizer: str | None = None

    def describe(self) -> dict:
        if self.text_file is None:
            return {"kind": "random-ids", "seed": self.seed, "id_range": [self.id_low, self.id_high]}
        return {
            "kind": "text-file",
            "seed": self.seed,
            "file": str(self.text_file),
            "tokenizer": self.tokenizer,
            "exact_length": self.tokenizer is not None,
        }


def parse_id_range(text: str) -> tuple[int, int]:
    """'LOW:HIGH' -> (LOW, HIGH) with 0 <= LOW < HIGH."""
    try:
        low, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise UserError(f"--id-range must be LOW:HIGH (two integers), got {text!r}") from None
    if not 0 <= low < high:
        raise UserError(f"--id-range needs 0 <= LOW < HIGH, got {text!r}")
    return low, high


def _random_ids(rng: random.Random, length: int, low: int, high: int) -> list[int]:
    span = high - low
    offset = rng.randrange(span)
    return [low + (offset + j) % span for j in range(length)]


def _load_tokenizer(name: str):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError("--tokenizer needs the transformers package (pip install transformers)") from None
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=True)
    except Exception as err:  # transformers raises many types for a bad path
        raise UserError(f"cannot load tokenizer {name!r}: {type(err).__name__}") from None


class PromptFactory:
    """Builds request bodies' prompt part: {"input_ids": [...]} or {"text": "..."}."""

    def __init__(self, source: PromptSource):
        self.source = source
        self._file_tokens: list[int] | None = None
        self._file_words: list[str] | None = None
        if source.text_file is not None:
            try:
                text = source.text_file.read_text(errors="replace")
            except OSError as err:
                raise UserError(f"cannot read --prompt-file {source.text_file}: {err.strerror}") from None
            if not text.strip():
                raise UserError(f"--prompt-file {source.text_file} is empty")
            if source.tokenizer:
                self._file_tokens = _load_tokenizer(source.tokenizer).encode(text, add_special_tokens=False)
            else:
                self._file_words = text.split()

    def prompts(self, context: int, count: int, salt: str) -> list[dict]:
        """`count` prompts of `context` tokens; the same (seed, context, salt) gives the same prompts."""
        rng = random.Random(f"{self.source.seed}:{context}:{salt}")
        if self._file_tokens is not None:
            return [{"input_ids": self._window(rng, self._file_tokens, context)} for _ in range(count)]
        if self._file_words is not None:
            # Without a tokenizer a word stands in for a token; the server's
            # prompt_tokens (recorded per cell) says what was really sent.
            return [{"text": " ".join(self._window(rng, self._file_words, context))} for _ in range(count)]
        return [
            {"input_ids": _random_ids(rng, context, self.source.id_low, self.source.id_high)} for _ in range(count)
        ]

    @staticmethod
    def _window(rng: random.Random, items: list, length: int) -> list:
        if len(items) >= length:
            start = rng.randrange(len(items) - length + 1)
            return items[start : start + length]
        repeats = -(-length // len(items))
        return (items * repeats)[:length]
