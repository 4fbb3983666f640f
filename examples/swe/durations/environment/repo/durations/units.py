"""The units a duration is written in, largest first."""

from __future__ import annotations

# (symbol, seconds); formatting walks them in this order
UNITS: tuple[tuple[str, int], ...] = (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
ALIASES = {"sec": "s", "secs": "s", "min": "m", "mins": "m", "hr": "h", "hrs": "h", "day": "d", "days": "d",
           "wk": "w", "wks": "w"}


def unit_seconds(symbol: str) -> int:
    """Seconds in one `symbol` (a symbol of UNITS or one of its ALIASES); KeyError naming it otherwise."""
    symbol = ALIASES.get(symbol, symbol)
    for name, seconds in UNITS:
        if name == symbol:
            return seconds
    raise KeyError(symbol)
