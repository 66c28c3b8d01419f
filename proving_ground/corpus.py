"""A seeded low-entropy text source for training the proving-ground model pair.

A first-order Markov chain over made-up words: every word has one dominant
successor (probability `DOMINANT_P`) and a few rare ones. A model trained on it
learns next-token margins of several nats, so its greedy continuations stay the
same under any bf16 kernel path (random weights flip on every path change).
Everything is a pure function of the seed: reruns rebuild the same text.
"""

from __future__ import annotations

import random

SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")
DOMINANT_P = 0.9
N_WORDS = 600
N_RARE_SUCCESSORS = 3
SENTENCE_END = "."


def make_words(seed: int, n_words: int = N_WORDS) -> list[str]:
    """Distinct pseudo-words of 1-3 syllables, in a seed-fixed order."""
    rng = random.Random(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n_words:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words + [SENTENCE_END]


def make_chain(words: list[str], seed: int) -> dict[str, tuple[list[str], list[float]]]:
    """word -> (successors, probabilities): one dominant successor, a few rare ones."""
    rng = random.Random(seed + 1)
    rare_p = (1.0 - DOMINANT_P) / N_RARE_SUCCESSORS
    chain = {}
    for word in words:
        successors = rng.sample(words, 1 + N_RARE_SUCCESSORS)
        chain[word] = (successors, [DOMINANT_P] + [rare_p] * N_RARE_SUCCESSORS)
    return chain


def generate_text(seed: int, n_words: int) -> str:
    """`n_words` words of chain text, sentences broken into lines."""
    words = make_words(seed)
    chain = make_chain(words, seed)
    rng = random.Random(seed + 2)
    word = rng.choice(words)
    out: list[str] = []
    for _ in range(n_words):
        out.append(word)
        successors, probs = chain[word]
        word = rng.choices(successors, probs)[0]
    return " ".join(out).replace(f" {SENTENCE_END} ", f" {SENTENCE_END}\n")


def corpus_lines(seed: int, n_words: int) -> list[str]:
    """The training corpus as lines (one sentence or so per line)."""
    return [line for line in generate_text(seed, n_words).split("\n") if line.strip()]


def make_prompts(seed: int, count: int = 8, words_per_prompt: int = 24) -> list[str]:
    """Fixed evaluation prompts: fresh walks of the same chain (a different stream)."""
    text = generate_text(seed + 1000, count * words_per_prompt).replace("\n", " ").split(" ")
    return [" ".join(text[i * words_per_prompt:(i + 1) * words_per_prompt]) for i in range(count)]
