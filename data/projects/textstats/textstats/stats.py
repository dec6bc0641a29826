"""Frequency statistics over a list of tokens."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


def word_frequencies(tokens: Iterable[str], stopwords: Iterable[str] = ()) -> Counter[str]:
    """Counts tokens, skipping any in `stopwords`."""
    skip = set(stopwords)
    return Counter(token for token in tokens if token not in skip)


def top_words(frequencies: Counter[str], k: int) -> list[tuple[str, int]]:
    """The `k` most frequent words, most frequent first; ties are broken alphabetically.

    Raises:
        ValueError: if `k` is negative.
    """
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    ranked = sorted(frequencies.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:k]


def type_token_ratio(tokens: Sequence[str]) -> float:
    """Distinct tokens divided by total tokens (lexical diversity); 0.0 for no tokens."""
    if not tokens:
        return 0.0
    return len(set(tokens)) / len(tokens)


def hapax_legomena(tokens: Iterable[str]) -> list[str]:
    """Words that occur exactly once, in order of first appearance."""
    counts = Counter(tokens)
    return [word for word, count in counts.items() if count == 1]


def average_length(tokens: Sequence[str]) -> float:
    """Mean number of characters per token; 0.0 for no tokens."""
    if not tokens:
        return 0.0
    return sum(len(token) for token in tokens) / len(tokens)


def length_histogram(tokens: Iterable[str]) -> dict[int, int]:
    """Maps token length to how many tokens have it, keys ascending."""
    counts = Counter(len(token) for token in tokens)
    return dict(sorted(counts.items()))
