"""The proving ground's text: Python source of an installed package, its prompts, and their periods.

Greedy continuations of a model trained on a made-up Markov text walk a finite graph into a cycle
of a few tokens, and a server's decode path then locks onto one phase of it: acceptance becomes a
property of the path. Real source text does not cycle. The target is trained until it reproduces
this text with margins of several nats (train.GAP_GOAL), so its greedy continuations are the text
itself, the same under every bf16 kernel path, and every prompt's continuation is as aperiodic as
the source it came from (`shortest_period` checks it).

The text is the pinned SGLang wheel's own sources (every machine here has them, byte for byte):
the subpackages in SUBPACKAGES, files in sorted order, each without its license header, until
MAX_BYTES. Everything is a pure function of the package folder: `fingerprint` names it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from pathlib import Path

# Hand-written code with few near-copies (models/ holds dozens of near-identical model files,
# whose shared openings a prompt could not tell apart).
SUBPACKAGES = ("srt/managers", "srt/speculative", "srt/mem_cache", "srt/sampling", "srt/entrypoints")
MAX_BYTES = 250_000
PROMPTS = 128  # the first SERVED are served in tables; the rest are traced for tune
SERVED = 64
PROMPT_TOKENS = 48
CONTINUATION_TOKENS = 256
MIN_PERIOD = 64


def package_root(name: str = "sglang") -> Path:
    """The installed package's folder, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"no installed package {name!r} to take the text from")
    return Path(next(iter(spec.submodule_search_locations)))


# A docstring that holds the license, wherever it sits (some files open with an import).
_LICENSE_DOCSTRING = re.compile(r'"""(?:(?!""").)*?Licensed under the Apache License(?:(?!""").)*?"""', re.S)


def _without_header(source: str) -> str:
    """The file less its license header (a leading comment block, or a docstring that names the
    license: most files repeat one of the two) and its blank lines."""
    lines = _LICENSE_DOCSTRING.sub("", source).splitlines()
    i = 0
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
        i += 1
    return "\n".join(line.rstrip() for line in lines[i:] if line.strip())


def source_files(root: Path) -> list[Path]:
    files = []
    for sub in SUBPACKAGES:
        files += sorted((root / sub).rglob("*.py"))
    return files


def corpus_lines(root: Path, max_bytes: int = MAX_BYTES) -> list[str]:
    """The text as lines: whole files in order until max_bytes (at least one file)."""
    out: list[str] = []
    size = 0
    for path in source_files(root):
        text = _without_header(path.read_text(encoding="utf-8"))
        if not text:
            continue
        if out and size + len(text) > max_bytes:
            break
        out += text.split("\n")
        size += len(text) + 1
    if not out:
        raise FileNotFoundError(f"{root}: none of {', '.join(SUBPACKAGES)} holds Python source")
    return out


def fingerprint(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def prompt_offsets(n_tokens: int, count: int = PROMPTS) -> list[int]:
    """Evenly spaced starts in the encoded text, each leaving room for its continuation."""
    room = n_tokens - PROMPT_TOKENS - CONTINUATION_TOKENS
    if room < count:
        raise ValueError(f"the text has {n_tokens} tokens: too few for {count} prompts")
    return [i * room // count for i in range(count)]


def shortest_period(tokens: list[int]) -> int:
    """The least p with tokens[i] == tokens[i + p] for every i: len(tokens) when none is shorter."""
    n = len(tokens)
    for p in range(1, n):
        if all(tokens[i] == tokens[i + p] for i in range(n - p)):
            return p
    return n
