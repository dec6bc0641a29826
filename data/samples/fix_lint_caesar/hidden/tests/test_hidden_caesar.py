"""Behaviour that a lint clean-up must keep."""

# Import grouping differs between this folder and the task workspace (where caesar is first-party).
# ruff: noqa: I001

import pytest

from caesar import crack, decrypt, encrypt, rot13, shift_char


def test_shift_char_round_trip_for_every_letter():
    for char in "abcxyzABCXYZ":
        assert shift_char(shift_char(char, 5), -5) == char
    assert shift_char("q", 0) == "q"


def test_encrypt_decrypt():
    assert encrypt("Zebra-42", 1) == "Afcsb-42"
    assert decrypt("Afcsb-42", 1) == "Zebra-42"


def test_rot13_is_its_own_inverse():
    assert rot13("Hello") == "Uryyb"
    assert rot13(rot13("Hello, World!")) == "Hello, World!"


def test_crack_finds_smallest_shift():
    assert crack(encrypt("the quick fox", 4), "quick") == 4
    assert crack("abc", "zzz") is None


def test_crack_rejects_empty_known_word():
    with pytest.raises(ValueError, match="known_word must not be empty"):
        crack("abc", "")
