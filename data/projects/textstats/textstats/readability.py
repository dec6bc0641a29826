"""Syllable estimates and the Flesch reading-ease score."""

from __future__ import annotations

import re
from dataclasses import dataclass

from textstats.stats import average_length, type_token_ratio
from textstats.tokenizer import split_sentences, tokenize_words

VOWEL_GROUP = re.compile(r"[aeiouy]+")


def count_syllables(word: str) -> int:
    """Estimates syllables as vowel groups, minus a silent final 'e'; at least 1 for a word.

    "make" -> 1, "table" -> 2 (a final "le" after a consonant is voiced), "the" -> 1.
    """
    word = word.lower().strip("'")
    if not word:
        return 0
    groups = len(VOWEL_GROUP.findall(word))
    if word.endswith("e") and not word.endswith(("le", "ee")) and groups > 1:
        groups -= 1
    return max(groups, 1)


def flesch_reading_ease(text: str) -> float:
    """206.835 - 1.015 * words/sentences - 84.6 * syllables/words, rounded to 2 decimals.

    Higher is easier. Raises ValueError for text without words.
    """
    words = tokenize_words(text)
    if not words:
        raise ValueError("text has no words")
    sentence_count = max(len(split_sentences(text)), 1)
    syllables = sum(count_syllables(word) for word in words)
    score = 206.835 - 1.015 * (len(words) / sentence_count) - 84.6 * (syllables / len(words))
    return round(score, 2)


@dataclass(frozen=True)
class Summary:
    """Headline statistics of one text."""

    words: int
    sentences: int
    unique_words: int
    average_word_length: float
    type_token_ratio: float
    reading_ease: float


def summarize(text: str) -> Summary:
    """Computes a `Summary` of `text`; raises ValueError for text without words."""
    words = tokenize_words(text)
    return Summary(
        words=len(words),
        sentences=len(split_sentences(text)),
        unique_words=len(set(words)),
        average_word_length=round(average_length(words), 2),
        type_token_ratio=round(type_token_ratio(words), 3),
        reading_ease=flesch_reading_ease(text),
    )
