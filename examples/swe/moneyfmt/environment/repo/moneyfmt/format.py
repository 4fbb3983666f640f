"""Writing an Amount as invoices show it: symbol, thousands separators, two decimals."""

from __future__ import annotations

from moneyfmt.amount import Amount


def group_thousands(digits: str, sep: str = ",") -> str:
    """`1234567` → `1,234,567`."""
    head = len(digits) % 3 or 3
    groups = [digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)]
    return sep.join(groups)


def format_amount(amount: Amount, symbol: bool = True, thousands: str = ",") -> str:
    """`Amount(123450)` → `$1,234.50`; without `symbol`, `1,234.50`; `thousands=""` leaves the separators out."""
    whole, cents = divmod(amount.cents, 100)
    text = f"{group_thousands(str(whole), thousands)}.{cents:02d}"
    return f"{amount.symbol}{text}" if symbol else text
