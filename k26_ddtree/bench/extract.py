"""Code extraction that survives thinking models.

The answer is what follows the LAST reasoning-end marker; the code is the last
fenced block of the answer. A block inside the reasoning never counts (the
field bug this guards against: grading a draft the model wrote while
thinking), and reasoning that was cut off before its end marker yields no code.

Markers (from the pinned SGLang's reasoning parsers, srt/parser/reasoning_parser.py):
- `<think>` ... `</think>`: Kimi K2 / K2.5 / K2.6 (`--reasoning-parser kimi_k2`), DeepSeek-R1, Qwen3;
- `◁think▷` ... `◁/think▷`: Kimi thinking models (`--reasoning-parser kimi`).
The chat template may open the reasoning block in the prompt; then the output
carries only the end marker, and `reasoning_open=True` says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REASONING_START_MARKERS = ("<think>", "◁think▷")
REASONING_END_MARKERS = ("</think>", "◁/think▷")

_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+.#-]*)[^\n]*\n(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_PYTHON_TAGS = {"", "python", "py", "python3"}


@dataclass(frozen=True)
class Extraction:
    code: str | None
    reason: str  # "ok", or why there is no code


def split_answer(text: str, reasoning_open: bool = False) -> str | None:
    """The answer after the last reasoning-end marker; None when reasoning never closed."""
    ends = [(text.rfind(m), m) for m in REASONING_END_MARKERS if m in text]
    if ends:
        position, marker = max(ends)
        return text[position + len(marker) :]
    if reasoning_open or any(m in text for m in REASONING_START_MARKERS):
        return None
    return text


def last_code_block(answer: str) -> str | None:
    """The last complete fenced block, preferring Python-tagged or untagged ones.

    An answer that ends with, say, a ```bash usage example still yields its
    last Python block; only when no block is Python-like does any block count.
    """
    blocks = [(m.group("lang").lower(), m.group("body")) for m in _FENCE.finditer(answer)]
    python_blocks = [body for lang, body in blocks if lang in _PYTHON_TAGS]
    chosen = python_blocks or [body for _, body in blocks]
    return chosen[-1] if chosen else None


def extract_code(text: str, reasoning_open: bool = False) -> Extraction:
    """Code from raw model output (/generate, or chat without a reasoning parser)."""
    answer = split_answer(text, reasoning_open)
    if answer is None:
        return Extraction(None, "reasoning truncated (no end marker)")
    code = last_code_block(answer)
    if code is None:
        return Extraction(None, "no fenced code block in the answer")
    return Extraction(code, "ok")


def extract_from_chat(message: dict, reasoning_open: bool = False) -> Extraction:
    """Code from a /v1/chat/completions message.

    With `--reasoning-parser` the server puts the reasoning in
    `reasoning_content` and the answer in `content`: only `content` counts,
    and an empty `content` means the reasoning was cut off. Without a parser
    the markers are still in `content` and are split here.
    """
    content = message.get("content") or ""
    if message.get("reasoning_content") is not None:
        if not content.strip():
            return Extraction(None, "reasoning truncated (empty content)")
        answer = split_answer(content) or ""
        code = last_code_block(answer)
        return Extraction(code, "ok") if code is not None else Extraction(None, "no fenced code block in the answer")
    return extract_code(content, reasoning_open)
