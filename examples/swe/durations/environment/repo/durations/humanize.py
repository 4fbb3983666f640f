"""Approximate durations for people: `about 2 hours`, `3 days`, `less than a minute`."""

from __future__ import annotations

from durations.units import UNITS

NAMES = {"w": "week", "d": "day", "h": "hour", "m": "minute", "s": "second"}


def approximate(seconds: int, prefix: bool = True) -> str:
    """The largest unit that `seconds` holds at least once, rounded to the nearest whole count: 5400 → `about 2
    hours`. Under a minute is `less than a minute`. `prefix` says `about` when the rounding changed the value."""
    if seconds < 0:
        raise ValueError(f"seconds must not be negative, got {seconds}")
    if seconds < 60:
        return "less than a minute"
    for symbol, size in UNITS:
        if seconds >= size:
            count = int(seconds / size + 0.5)
            text = f"{count} {NAMES[symbol]}{'' if count == 1 else 's'}"
            return f"about {text}" if prefix and count * size != seconds else text
    raise AssertionError("unreachable: UNITS ends with seconds")
