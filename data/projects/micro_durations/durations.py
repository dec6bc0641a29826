"""Parsing and formatting durations such as "1h30m15s"."""

import re

UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
PART = re.compile(r"(\d+)([dhms])")


def parse_duration(text: str) -> int:
    """Seconds in `text`, made of number+unit parts in the order d, h, m, s ("2h5s")."""
    text = text.strip().lower()
    parts = PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r}")
    units = [unit for _, unit in parts]
    if units != sorted(set(units), key="dhms".index):
        raise ValueError(f"units out of order or repeated in {text!r}")
    return sum(int(number) * UNIT_SECONDS[unit] for number, unit in parts)


def format_duration(seconds: int) -> str:
    """The inverse of `parse_duration`, omitting zero parts; 0 is "0s"."""
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {seconds}")
    parts = []
    for unit, size in UNIT_SECONDS.items():
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
