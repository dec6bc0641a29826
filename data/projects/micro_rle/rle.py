"""Run-length encoding: "aaab" <-> "3a1b"."""

import re

RUN = re.compile(r"(\d+)(\D)")


def runs(text: str) -> list[tuple[str, int]]:
    """Groups `text` into (character, run length) pairs."""
    result: list[tuple[str, int]] = []
    for char in text:
        if result and result[-1][0] == char:
            result[-1] = (char, result[-1][1] + 1)
        else:
            result.append((char, 1))
    return result


def encode(text: str) -> str:
    """Encodes each run as its length followed by the character; digits cannot be encoded."""
    if any(char.isdigit() for char in text):
        raise ValueError("text with digits cannot be run-length encoded")
    return "".join(f"{count}{char}" for char, count in runs(text))


def decode(encoded: str) -> str:
    """Inverts `encode`."""
    pairs = RUN.findall(encoded)
    if "".join(count + char for count, char in pairs) != encoded:
        raise ValueError(f"malformed run-length string {encoded!r}")
    return "".join(char * int(count) for count, char in pairs)
