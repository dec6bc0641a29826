"""Splitting text into words, sentences and n-grams."""

from __future__ import annotations

import re
from collections.abc import Sequence

# A word is a run of letters or digits, optionally joined by single apostrophes or hyphens
# ("don't", "well-known"); leading and trailing punctuation is never part of a word.
WORD = re.compile(r"[^\W_]+(?:['\u2019-][^\W_]+)*")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
ABBREVIATIONS = frozenset({"dr.", "mr.", "mrs.", "ms.", "prof.", "e.g.", "i.e.", "etc.", "vs."})


def tokenize_words(text: str, lowercase: bool = True) -> list[str]:
    """Returns the words of `text` in order, lower-cased unless `lowercase` is False."""
    words = WORD.findall(text)
    return [word.lower() for word in words] if lowercase else words


def split_sentences(text: str) -> list[str]:
    """Splits `text` after `.`, `!` or `?` followed by whitespace.

    A break after a known abbreviation ("Dr.", "e.g.") is not a sentence end. Surrounding
    whitespace is stripped and empty sentences are dropped.
    """
    pieces = SENTENCE_END.split(text.strip())
    sentences: list[str] = []
    pending = ""
    for piece in pieces:
        pending = f"{pending} {piece}" if pending else piece
        last_word = pending.rsplit(maxsplit=1)[-1].lower() if pending.strip() else ""
        if last_word in ABBREVIATIONS:
            continue
        if pending.strip():
            sentences.append(pending.strip())
        pending = ""
    if pending.strip():
        sentences.append(pending.strip())
    return sentences


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """All contiguous n-token windows of `tokens`; empty when there are fewer than `n` tokens.

    Raises:
        ValueError: if `n` is not positive.
    """
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    return [tuple(tokens[start : start + n]) for start in range(len(tokens) - n + 1)]
