"""Benchmark prompts: token-id prompts of an exact length, windows of a local text file, or
the exact prompts of a prompt set (`prompt_set.py`).

Token-id prompts follow the pinned SGLang's `random-ids` dataset: each prompt is a run of
consecutive ids from a random offset, wrapped into an id range, so no tokenizer and no
download are needed and the length is exact. The range always lies inside the served
model's vocabulary (`vocab.py`) and skips its special ids: one id past the end takes the
server down.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.bench.prompt_set import PromptSet, read_prompt_set, read_regular
from k26_ddtree.bench.vocab import Vocabulary
from k26_ddtree.errors import UserError

# Low ids hold special and control tokens in most vocabularies; the top of Kimi's
# vocabulary (163584+) holds its chat markers. Stay between them when the user names no range.
DEFAULT_ID_LOW = 1000
DEFAULT_ID_HIGH = 30000


@dataclass(frozen=True)
class PromptSource:
    """Where prompts come from (the flags); `PromptFactory.describe()` records what was used."""

    seed: int
    id_range: tuple[int, int] | None = None  # --id-range; None: the default range, cut to the vocabulary
    vocab_size: int | None = None  # --vocab-size, for a server whose model folder is not on this machine
    text_file: Path | None = None
    tokenizer: str | None = None
    prompt_set: Path | None = None  # --prompt-set: these prompts, as given, instead of made ones


def parse_id_range(text: str) -> tuple[int, int]:
    """'LOW:HIGH' -> (LOW, HIGH) with 0 <= LOW < HIGH."""
    try:
        low, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise UserError(f"--id-range must be LOW:HIGH (two integers), got {text!r}") from None
    if low < 0:
        raise UserError(f"--id-range LOW is {low}: token ids are never negative (0 <= LOW < HIGH)")
    if low >= high:
        raise UserError(f"--id-range needs 0 <= LOW < HIGH, got {text!r}")
    return low, high


def prompt_ids(requested: tuple[int, int] | None, vocabulary: Vocabulary) -> list[int]:
    """The ids random-ids prompts draw from: the range, inside the vocabulary, without special ids."""
    size, source = vocabulary.size, vocabulary.source
    if requested is None:
        low, high = DEFAULT_ID_LOW, min(DEFAULT_ID_HIGH, size)
        if low >= high:
            raise UserError(f"the served model has {size} token ids ({source}), fewer than the default "
                            f"--id-range {DEFAULT_ID_LOW}:{DEFAULT_ID_HIGH} needs: pass --id-range LOW:HIGH "
                            f"with HIGH <= {size}")
    else:
        low, high = requested
        if high > size:
            raise UserError(f"--id-range {low}:{high} reaches past the served model's {size} token ids "
                            f"({source}): use HIGH <= {size}")
    ids = [i for i in range(low, high) if i not in vocabulary.special_ids]
    if not ids:
        raise UserError(f"--id-range {low}:{high} holds only special ids of the served model")
    return ids


def _random_ids(rng: random.Random, length: int, ids: list[int]) -> list[int]:
    offset = rng.randrange(len(ids))
    return [ids[(offset + j) % len(ids)] for j in range(length)]


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
    """Builds request bodies' prompt part: {"input_ids": [...]} or {"text": "..."}.

    The text file or prompt set is read at once (a bad one fails before the server is asked);
    prompts with token ids need `limit_to(vocabulary)` first.
    """

    def __init__(self, source: PromptSource):
        self.source = source
        self._file_tokens: list[int] | None = None
        self._file_words: list[str] | None = None
        self._ids: list[int] | None = None
        self._vocabulary: Vocabulary | None = None
        self.prompt_set: PromptSet | None = None
        if source.prompt_set is not None:
            self.prompt_set = read_prompt_set(source.prompt_set)
        elif source.text_file is not None:
            text = read_regular(source.text_file, "--prompt-file").decode(errors="replace")
            if not text.strip():
                raise UserError(f"--prompt-file {source.text_file} is empty")
            if source.tokenizer:
                self._file_tokens = _load_tokenizer(source.tokenizer).encode(text, add_special_tokens=False)
            else:
                self._file_words = text.split()

    @property
    def needs_vocabulary(self) -> bool:
        """Whether prompts carry token ids (text prompts are tokenized by the server itself)."""
        if self.prompt_set is not None:
            return bool(self.prompt_set.token_ids)
        return self.source.text_file is None or self.source.tokenizer is not None

    def limit_to(self, vocabulary: Vocabulary) -> None:
        """Keep every prompt's ids inside `vocabulary`, or refuse (UserError) when they cannot be."""
        if self.prompt_set is not None:
            # Special ids stay: a set of real prompts carries its chat markers as the tokenizer gave them.
            past = max(self.prompt_set.token_ids)
            if past >= vocabulary.size:
                raise UserError(f"--prompt-set {self.source.prompt_set} holds token id {past}, past the served "
                                f"model's {vocabulary.size} ids ({vocabulary.source})")
        elif self._file_tokens is not None:
            past = max(self._file_tokens)
            if past >= vocabulary.size:
                raise UserError(f"--tokenizer {self.source.tokenizer} gives token id {past}, past the served "
                                f"model's {vocabulary.size} ids ({vocabulary.source}): use the model's own tokenizer")
        elif self._file_words is None:
            self._ids = prompt_ids(self.source.id_range, vocabulary)
        self._vocabulary = vocabulary

    def describe(self) -> dict:
        """The prompt settings the run used (goes into the run JSON)."""
        vocabulary = self._vocabulary.describe() if self._vocabulary else None
        if self.prompt_set is not None:
            return {"kind": "prompt-set", "file": str(self.prompt_set.path), "prompts": len(self.prompt_set.prompts),
                    "sha256": self.prompt_set.sha256, "vocabulary": vocabulary}
        if self.source.text_file is None:
            return {"kind": "random-ids", "seed": self.source.seed, "id_range": [self._ids[0], self._ids[-1] + 1],
                    "vocabulary": vocabulary}
        return {
            "kind": "text-file",
            "seed": self.source.seed,
            "file": str(self.source.text_file),
            "tokenizer": self.source.tokenizer,
            "exact_length": self.source.tokenizer is not None,
            "vocabulary": vocabulary,
        }

    def prompts(self, context: int, count: int, salt: str) -> list[dict]:
        """`count` prompts of `context` tokens; the same (seed, context, salt) gives the same prompts."""
        if self.needs_vocabulary and self._vocabulary is None:
            raise RuntimeError("token-id prompts before limit_to(vocabulary)")
        if self.prompt_set is not None:  # the set in file order, cycled: the same prompts for every cell
            cycle = self.prompt_set.prompts
            return [dict(cycle[i % len(cycle)]) for i in range(count)]
        rng = random.Random(f"{self.source.seed}:{context}:{salt}")
        if self._file_tokens is not None:
            return [{"input_ids": self._window(rng, self._file_tokens, context)} for _ in range(count)]
        if self._file_words is not None:
            # Without a tokenizer a word stands in for a token; the server's
            # prompt_tokens (recorded per cell) says what was really sent.
            return [{"text": " ".join(self._window(rng, self._file_words, context))} for _ in range(count)]
        return [{"input_ids": _random_ids(rng, context, self._ids)} for _ in range(count)]

    @staticmethod
    def _window(rng: random.Random, items: list, length: int) -> list:
        if len(items) >= length:
            start = rng.randrange(len(items) - length + 1)
            return items[start : start + length]
        repeats = -(-length // len(items))
        return (items * repeats)[:length]
