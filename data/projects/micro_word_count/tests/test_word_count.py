from wordcount import Counts, count, most_common_word, word_frequencies


def test_count():
    assert count("one two\nthree\n") == Counts(lines=2, words=3, chars=14)


def test_count_last_line_without_newline():
    assert count("a b\nc") == Counts(1, 3, 5)


def test_count_empty_and_whitespace():
    assert count("") == Counts(0, 0, 0)
    assert count("  \n\t") == Counts(1, 0, 4)


def test_word_frequencies_normalizes_case_and_punctuation():
    frequencies = word_frequencies("The cat, the HAT. (the) -- !")
    assert frequencies == {"the": 3, "cat": 1, "hat": 1, "--": 1}


def test_most_common_word():
    assert most_common_word("b a b a b") == "b"
    assert most_common_word("x y y x") == "x"
    assert most_common_word("... !!") is None
