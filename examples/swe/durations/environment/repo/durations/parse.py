"""Reading `1h30m`, `90s`, `2 days 3h` into whole seconds."""

from __future__ import annotations

import re

from durations.units import unit_seconds

PART = re.compile(r"\s*(\d+)\s*([a-z]+)\s*")


class DurationError(ValueError):
    """Text that is not a duration."""


def parse_duration(text: str) -> int:
    """Whole seconds in `text`: one or more `<number><unit>` parts (units.UNITS or an alias), each unit at most once;
    a bare number is seconds."""
    clean = text.strip().lower()
    if not clean:
        raise DurationError("empty duration")
    if clean.isdigit():
        return int(clean)
    total, pos, seen = 0, 0, set()
    while pos < len(clean):
        match = PART.match(clean, pos)
        if match is None:
            raise DurationError(f"cannot read {text!r} at {clean[pos:]!r}")
        number, unit = match.groups()
        try:
            seconds = unit_seconds(unit)
        except KeyError:
            raise DurationError(f"unknown unit {unit!r} in {text!r}") from None
        if seconds in seen:
            raise DurationError(f"unit {unit!r} given twice in {text!r}")
        seen.add(seconds)
        total += int(number) * seconds
        pos = match.end()
    return total
