"""`--prompt-set FILE`: exact prompts, one JSON object a line ({"input_ids": [...]} or
{"text": "..."}), sent as given and in file order. Every line is checked before the server is
asked; a bad one is one line naming the file and the line number."""

from __future__ import annotations

import hashlib
import json
import stat
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.errors import UserError


def read_regular(path: Path, flag: str) -> bytes:
    """The bytes of the regular file `path`, else one UserError line naming `flag`. A FIFO
    without a writer blocks the open, and a device such as /dev/zero never ends."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise UserError(f"{flag} {path} is not a regular file (a FIFO or device could be read without end)")
        return path.read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {flag} {path}: {err.strerror}") from None


@dataclass(frozen=True)
class PromptSet:
    path: Path
    prompts: tuple[dict, ...]
    sha256: str

    @property
    def context(self) -> int:
        """The cell's context: the mean prompt length, a word per token for text lines (the
        server's prompt_tokens, recorded per cell, says what was really sent)."""
        lengths = [len(p["input_ids"]) if "input_ids" in p else len(p["text"].split()) for p in self.prompts]
        return max(1, round(sum(lengths) / len(lengths)))

    @property
    def token_ids(self) -> list[int]:
        return [i for p in self.prompts for i in p.get("input_ids", ())]


def _prompt(line: str) -> dict:
    """The prompt of one line; ValueError saying what is wrong with it."""
    try:
        value = json.loads(line)
    # ValueError beside JSONDecodeError: an integer of more digits than Python converts
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    keys = [key for key in ("input_ids", "text") if key in value]
    if len(keys) != 1:
        raise ValueError('needs exactly one of "input_ids" and "text"')
    if keys == ["text"]:
        if not isinstance(value["text"], str) or not value["text"].strip():
            raise ValueError('"text" is not a non-empty string')
        return {"text": value["text"]}
    ids = value["input_ids"]
    if not isinstance(ids, list) or not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError('"input_ids" is not a non-empty list of non-negative integers')
    return {"input_ids": ids}


def read_prompt_set(path: Path) -> PromptSet:
    data = read_regular(path, "--prompt-set")
    try:
        text = data.decode("utf-8-sig")  # an editor's byte-order mark is no part of line 1
    except UnicodeDecodeError:
        raise UserError(f"--prompt-set {path} is not UTF-8 text") from None
    prompts = []
    # Lines end at "\n" only: JSON strings may hold U+2028 or U+0085 raw, where splitlines cuts.
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            prompts.append(_prompt(line))
        except ValueError as err:
            raise UserError(f"--prompt-set {path} line {number}: {err}") from None
    if not prompts:
        raise UserError(f"--prompt-set {path} holds no prompt")
    return PromptSet(path, tuple(prompts), hashlib.sha256(data).hexdigest())
