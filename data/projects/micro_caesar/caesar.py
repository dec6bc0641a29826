"""The Caesar cipher over the English alphabet."""

import string

ALPHABET_SIZE = 26


def shift_char(char: str, shift: int) -> str:
    """Shifts an ASCII letter by `shift` places, keeping its case; other characters pass through."""
    if char in string.ascii_lowercase:
        base = ord("a")
    elif char in string.ascii_uppercase:
        base = ord("A")
    else:
        return char
    return chr(base + (ord(char) - base + shift) % ALPHABET_SIZE)


def encrypt(text: str, shift: int) -> str:
    return "".join(shift_char(char, shift) for char in text)


def decrypt(text: str, shift: int) -> str:
    return encrypt(text, -shift)


def crack(ciphertext: str, known_word: str) -> int | None:
    """The smallest shift whose decryption contains `known_word`, or None."""
    for shift in range(ALPHABET_SIZE):
        if known_word in decrypt(ciphertext, shift):
            return shift
    return None
