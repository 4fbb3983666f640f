"""Reading `$1,234.50`, `1234.5` or `€0.99` into an Amount."""

from __future__ import annotations

import re

from moneyfmt.amount import SYMBOLS, Amount

BY_SYMBOL = {symbol: code for code, symbol in SYMBOLS.items()}
AMOUNT = re.compile(r"(?P<symbol>[$€£])?(?P<whole>\d{1,3}(?:,\d{3})*|\d+)(?:\.(?P<frac>\d{1,2}))?")


class AmountError(ValueError):
    """Text that is not an amount."""


def parse_amount(text: str, currency: str | None = None) -> Amount:
    """The Amount `text` writes. The currency is the symbol's, else `currency`, else USD; a symbol that disagrees
    with `currency` is an error. At most two decimals; thousands separators only in groups of three."""
    match = AMOUNT.fullmatch(text.strip())
    if match is None:
        raise AmountError(f"not an amount: {text!r}")
    code = BY_SYMBOL.get(match["symbol"] or "", None)
    if code and currency and code != currency:
        raise AmountError(f"{text!r} is in {code}, not {currency}")
    whole = int(match["whole"].replace(",", ""))
    frac = int((match["frac"] or "0").ljust(2, "0"))
    return Amount(whole * 100 + frac, code or currency or "USD")
