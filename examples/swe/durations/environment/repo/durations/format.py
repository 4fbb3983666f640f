"""Writing seconds as `1h 30m`."""

from __future__ import annotations

from durations.units import UNITS


def format_duration(seconds: int, max_parts: int | None = None, compact: bool = False) -> str:
    """`seconds` in the largest units first, zero parts left out: 5400 → `1h 30m`. `max_parts` keeps only the
    largest parts (the rest is dropped, not rounded); `compact` writes them without spaces (`1h30m`), as
    parse_duration reads either form."""
    if seconds < 0:
        raise ValueError(f"seconds must not be negative, got {seconds}")
    if max_parts is not None and max_parts < 1:
        raise ValueError(f"max_parts must be at least 1, got {max_parts}")
    parts: list[str] = []
    left = int(seconds)
    for symbol, size in UNITS:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{symbol}")
    if max_parts is not None:
        parts = parts[:max_parts]
    return ("" if compact else " ").join(parts)
