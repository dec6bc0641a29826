"""textstats: tokenize English text and compute word and readability statistics."""

from textstats.readability import count_syllables, flesch_reading_ease, summarize
from textstats.stats import hapax_legomena, top_words, type_token_ratio, word_frequencies
from textstats.tokenizer import ngrams, split_sentences, tokenize_words

__all__ = [
    "count_syllables",
    "flesch_reading_ease",
    "hapax_legomena",
    "ngrams",
    "split_sentences",
    "summarize",
    "tokenize_words",
    "top_words",
    "type_token_ratio",
    "word_frequencies",
]
