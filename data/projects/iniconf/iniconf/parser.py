"""Turns INI text into a `Config`."""

from __future__ import annotations

from collections.abc import Iterable

from iniconf.config import DEFAULT_SECTION, Config
from iniconf.errors import ParseError

COMMENT_PREFIXES = ("#", ";")


def _strip_inline_comment(value: str) -> str:
    """Removes a trailing ` #` or ` ;` comment; a prefix not preceded by whitespace is kept."""
    for index, char in enumerate(value):
        if char in COMMENT_PREFIXES and index > 0 and value[index - 1].isspace():
            return value[:index].rstrip()
    return value


def _split_pair(line: str) -> tuple[str, str] | None:
    """Splits `key = value` or `key: value` at the first separator; None if there is none."""
    positions = [pos for pos in (line.find("="), line.find(":")) if pos != -1]
    if not positions:
        return None
    cut = min(positions)
    return line[:cut].strip(), line[cut + 1 :].strip()


def parse_lines(lines: Iterable[str]) -> Config:
    """Parses INI lines into a `Config`.

    Keys are case-insensitive (stored lower-cased); section names are case-sensitive.
    Pairs before the first header land in the `DEFAULT` section, whose keys every other
    section inherits. A line indented deeper than its key continues the previous value.

    Raises:
        ParseError: on a malformed header, a line that is not a pair, a duplicate key
            within a section, or a continuation line with nothing to continue.
    """
    config = Config()
    section = DEFAULT_SECTION
    last_key: str | None = None
    for line_number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        stripped = line.strip()
        if not stripped or stripped.startswith(COMMENT_PREFIXES):
            continue
        if line[0].isspace():
            if last_key is None:
                raise ParseError("continuation line without a key", line_number, line)
            previous = config.raw(section, last_key)
            config.set(section, last_key, f"{previous}\n{_strip_inline_comment(stripped)}")
            continue
        if stripped.startswith("["):
            if not stripped.endswith("]") or len(stripped) < 3:
                raise ParseError("malformed section header", line_number, line)
            section = stripped[1:-1].strip()
            if not section:
                raise ParseError("empty section name", line_number, line)
            config.add_section(section)
            last_key = None
            continue
        pair = _split_pair(stripped)
        if pair is None or not pair[0]:
            raise ParseError("expected 'key = value'", line_number, line)
        key, value = pair[0].lower(), _strip_inline_comment(pair[1])
        if config.has_own_key(section, key):
            raise ParseError(f"duplicate key {key!r} in section {section!r}", line_number, line)
        config.set(section, key, value)
        last_key = key
    return config


def parse(text: str) -> Config:
    """Parses INI text; see `parse_lines`."""
    return parse_lines(text.splitlines())
