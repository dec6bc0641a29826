"""The parsed configuration: sections of string values with typed, interpolating getters."""

from __future__ import annotations

import re

from iniconf.errors import ConfigError, InterpolationError

DEFAULT_SECTION = "DEFAULT"
TRUE_WORDS = frozenset({"1", "yes", "true", "on"})
FALSE_WORDS = frozenset({"0", "no", "false", "off"})
REFERENCE = re.compile(r"\$\{([^}]+)\}")
MAX_INTERPOLATION_DEPTH = 10


class Config:
    """Sections of `key -> raw string`, read through typed getters.

    Every section inherits the keys of `DEFAULT`; its own keys win. Values may reference
    other values as `${key}` (same section) or `${section:key}`.
    """

    def __init__(self) -> None:
        self._sections: dict[str, dict[str, str]] = {DEFAULT_SECTION: {}}

    def add_section(self, name: str) -> None:
        """Creates `name` if it does not exist yet (re-opening a section is allowed)."""
        self._sections.setdefault(name, {})

    def sections(self) -> list[str]:
        """Names of the sections in definition order, without `DEFAULT`."""
        return [name for name in self._sections if name != DEFAULT_SECTION]

    def set(self, section: str, key: str, value: str) -> None:
        """Stores `value` under `key` (lower-cased), creating the section if needed."""
        self.add_section(section)
        self._sections[section][key.lower()] = value

    def has_own_key(self, section: str, key: str) -> bool:
        """Whether `section` itself (not `DEFAULT`) defines `key`."""
        return key.lower() in self._sections.get(section, {})

    def keys(self, section: str) -> list[str]:
        """All keys visible in `section`: its own first, then inherited ones."""
        own = list(self._section(section))
        inherited = [key for key in self._sections[DEFAULT_SECTION] if key not in own]
        return own + inherited

    def raw(self, section: str, key: str) -> str:
        """The uninterpolated value of `key` in `section`, falling back to `DEFAULT`."""
        values = self._section(section)
        key = key.lower()
        if key in values:
            return values[key]
        if key in self._sections[DEFAULT_SECTION]:
            return self._sections[DEFAULT_SECTION][key]
        raise ConfigError(f"no key {key!r} in section {section!r}")

    def get(self, section: str, key: str, default: str | None = None) -> str:
        """The interpolated value, or `default` when the key is missing and a default is given."""
        try:
            raw = self.raw(section, key)
        except ConfigError:
            if default is None:
                raise
            return default
        return self._interpolate(section, raw, depth=0)

    def get_int(self, section: str, key: str, default: int | None = None) -> int:
        """The value parsed as an int."""
        if default is not None and not self._has(section, key):
            return default
        value = self.get(section, key)
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{section}.{key}: expected an integer, got {value!r}") from None

    def get_float(self, section: str, key: str, default: float | None = None) -> float:
        """The value parsed as a float."""
        if default is not None and not self._has(section, key):
            return default
        value = self.get(section, key)
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{section}.{key}: expected a number, got {value!r}") from None

    def get_bool(self, section: str, key: str, default: bool | None = None) -> bool:
        """The value as a bool: 1/yes/true/on or 0/no/false/off, case-insensitive."""
        if default is not None and not self._has(section, key):
            return default
        value = self.get(section, key).lower()
        if value in TRUE_WORDS:
            return True
        if value in FALSE_WORDS:
            return False
        raise ConfigError(f"{section}.{key}: expected a boolean, got {value!r}")

    def get_list(self, section: str, key: str, separator: str = ",") -> list[str]:
        """The value split on `separator` and on newlines, items stripped, empty items dropped."""
        value = self.get(section, key).replace("\n", separator)
        return [item.strip() for item in value.split(separator) if item.strip()]

    def to_dict(self) -> dict[str, dict[str, str]]:
        """Every section (without `DEFAULT`) with all its visible keys interpolated."""
        return {name: {key: self.get(name, key) for key in self.keys(name)} for name in self.sections()}

    def _has(self, section: str, key: str) -> bool:
        try:
            self.raw(section, key)
        except ConfigError:
            return False
        return True

    def _section(self, section: str) -> dict[str, str]:
        if section not in self._sections:
            raise ConfigError(f"no section {section!r}")
        return self._sections[section]

    def _interpolate(self, section: str, value: str, depth: int) -> str:
        if depth > MAX_INTERPOLATION_DEPTH:
            raise InterpolationError(f"interpolation deeper than {MAX_INTERPOLATION_DEPTH} in {section!r}")

        def substitute(match: re.Match[str]) -> str:
            reference = match.group(1)
            target_section, _, target_key = reference.rpartition(":")
            target_section = target_section or section
            try:
                raw = self.raw(target_section, target_key)
            except ConfigError as error:
                raise InterpolationError(f"bad reference ${{{reference}}}: {error}") from None
            return self._interpolate(target_section, raw, depth + 1)

        return REFERENCE.sub(substitute, value)
