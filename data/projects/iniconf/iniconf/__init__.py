"""iniconf: a small INI-style configuration parser."""

from iniconf.config import Config
from iniconf.errors import ConfigError, InterpolationError, ParseError
from iniconf.parser import parse, parse_lines

__all__ = ["Config", "ConfigError", "InterpolationError", "ParseError", "parse", "parse_lines"]
