import pytest

from rle import decode, encode, runs


def test_runs():
    assert runs("aaabcc") == [("a", 3), ("b", 1), ("c", 2)]
    assert runs("abab") == [("a", 1), ("b", 1), ("a", 1), ("b", 1)]
    assert runs("") == []


def test_encode():
    assert encode("aaabcc") == "3a1b2c"
    assert encode("x") == "1x"
    assert encode("") == ""
    assert encode("  !!") == "2 2!"


def test_encode_long_runs():
    assert encode("z" * 12) == "12z"


def test_encode_rejects_digits():
    with pytest.raises(ValueError, match="digits"):
        encode("a1")


def test_decode():
    assert decode("3a1b2c") == "aaabcc"
    assert decode("12z") == "z" * 12
    assert decode("") == ""


@pytest.mark.parametrize("text", ["hello  world", "aaaa", "abc", "mississippi"])
def test_round_trip(text):
    assert decode(encode(text)) == text


@pytest.mark.parametrize("encoded", ["a", "3", "3ab", "x2y"])
def test_decode_rejects_malformed(encoded):
    with pytest.raises(ValueError, match="malformed run-length string"):
        decode(encoded)
