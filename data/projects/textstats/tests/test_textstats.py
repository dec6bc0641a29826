from collections import Counter

import pytest

from textstats import (
    count_syllables,
    flesch_reading_ease,
    hapax_legomena,
    ngrams,
    split_sentences,
    summarize,
    tokenize_words,
    top_words,
    type_token_ratio,
    word_frequencies,
)
from textstats.stats import average_length, length_histogram


def test_tokenize_lowercases_and_drops_punctuation():
    assert tokenize_words("Hello, World! (again)") == ["hello", "world", "again"]


def test_tokenize_keeps_case_when_asked():
    assert tokenize_words("Hello World", lowercase=False) == ["Hello", "World"]


def test_tokenize_keeps_internal_apostrophes_and_hyphens():
    assert tokenize_words("don't stop well-known 'quoted' --dash") == [
        "don't",
        "stop",
        "well-known",
        "quoted",
        "dash",
    ]


def test_tokenize_numbers_and_underscores():
    assert tokenize_words("route_66 in 1999") == ["route", "66", "in", "1999"]


def test_split_sentences_basic():
    assert split_sentences("One. Two!  Three?") == ["One.", "Two!", "Three?"]


def test_split_sentences_keeps_abbreviations_together():
    text = "Dr. Smith arrived. He sat, e.g. on a chair."
    assert split_sentences(text) == ["Dr. Smith arrived.", "He sat, e.g. on a chair."]


def test_split_sentences_trailing_fragment_and_empty():
    assert split_sentences("  First.  and more  ") == ["First.", "and more"]
    assert split_sentences("   ") == []


def test_split_sentences_text_ending_in_abbreviation():
    assert split_sentences("See Dr.") == ["See Dr."]


def test_ngrams():
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    assert ngrams(["a", "b", "c"], 3) == [("a", "b", "c")]
    assert ngrams(["a", "b", "c"], 1) == [("a",), ("b",), ("c",)]
    assert ngrams(["a"], 2) == []


def test_ngrams_rejects_non_positive_n():
    with pytest.raises(ValueError, match="n must be positive"):
        ngrams(["a"], 0)


def test_word_frequencies_with_stopwords():
    counts = word_frequencies(["the", "cat", "the", "hat"], stopwords={"hat"})
    assert counts == Counter({"the": 2, "cat": 1})


def test_top_words_orders_by_count_then_alphabet():
    counts = Counter({"b": 2, "a": 2, "c": 5, "d": 1})
    assert top_words(counts, 3) == [("c", 5), ("a", 2), ("b", 2)]
    assert top_words(counts, 0) == []
    assert top_words(counts, 10)[-1] == ("d", 1)


def test_top_words_rejects_negative_k():
    with pytest.raises(ValueError, match="k must be non-negative"):
        top_words(Counter(), -1)


def test_type_token_ratio():
    assert type_token_ratio(["a", "b", "a", "c"]) == 0.75
    assert type_token_ratio([]) == 0.0


def test_hapax_legomena_in_first_appearance_order():
    assert hapax_legomena(["x", "a", "b", "a", "c"]) == ["x", "b", "c"]


def test_average_length_and_histogram():
    assert average_length(["ab", "abcd"]) == 3.0
    assert average_length([]) == 0.0
    assert length_histogram(["abc", "a", "xyz", "ab"]) == {1: 1, 2: 1, 3: 2}
    assert list(length_histogram(["abc", "a"])) == [1, 3]


@pytest.mark.parametrize(
    "word, syllables",
    [("cat", 1), ("make", 1), ("the", 1), ("table", 2), ("free", 1), ("banana", 3), ("rhythm", 1),
     ("'tis", 1), ("separate", 3), ("", 0), ("'", 0), ("education", 4)],
)
def test_count_syllables(word, syllables):
    assert count_syllables(word) == syllables


def test_flesch_reading_ease_value():
    # 6 words, 2 sentences, 6 syllables: 206.835 - 1.015 * 3 - 84.6 * 1
    assert flesch_reading_ease("The cat sat. The dog ran.") == 119.19


def test_flesch_reading_ease_counts_unterminated_text_as_one_sentence():
    assert flesch_reading_ease("cat sat") == round(206.835 - 1.015 * 2 - 84.6, 2)


def test_flesch_rejects_text_without_words():
    with pytest.raises(ValueError, match="no words"):
        flesch_reading_ease("... !!")


def test_summarize():
    summary = summarize("The cat sat. The dog ran.")
    assert summary.words == 6
    assert summary.sentences == 2
    assert summary.unique_words == 5
    assert summary.average_word_length == 3.0
    assert summary.type_token_ratio == 0.833
    assert summary.reading_ease == 119.19
