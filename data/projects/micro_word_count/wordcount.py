"""Counting lines, words and characters, like the Unix `wc`."""

from collections import Counter
from typing import NamedTuple


class Counts(NamedTuple):
    lines: int
    words: int
    chars: int


def count(text: str) -> Counts:
    """Newline-terminated lines, whitespace-separated words and characters of `text`."""
    return Counts(text.count("\n"), len(text.split()), len(text))


def word_frequencies(text: str) -> Counter[str]:
    """How often each word occurs, case-insensitively, ignoring surrounding punctuation."""
    words = (word.strip(".,;:!?\"'()").lower() for word in text.split())
    return Counter(word for word in words if word)


def most_common_word(text: str) -> str | None:
    """The most frequent word (the earliest one on ties), or None for a text without words."""
    frequencies = word_frequencies(text)
    if not frequencies:
        return None
    return frequencies.most_common(1)[0][0]
