"""Exceptions raised by iniconf."""


class ConfigError(Exception):
    """Base class for every error raised by iniconf."""


class ParseError(ConfigError):
    """The configuration text is malformed.

    Attributes:
        line_number: 1-based line on which the problem was found.
        line: the offending line, without its newline.
    """

    def __init__(self, message: str, line_number: int, line: str) -> None:
        super().__init__(f"line {line_number}: {message}: {line!r}")
        self.line_number = line_number
        self.line = line


class InterpolationError(ConfigError):
    """A `${...}` reference names a missing key or forms a cycle."""
