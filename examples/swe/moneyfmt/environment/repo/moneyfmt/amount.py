"""Amount: a sum of money in whole cents of one currency."""

from __future__ import annotations

from dataclasses import dataclass

SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£"}


@dataclass(frozen=True, order=True)
class Amount:
    """`cents` of `currency` (an ISO 4217 code of SYMBOLS); negative for refunds and credits."""

    cents: int
    currency: str = "USD"

    def __post_init__(self) -> None:
        if self.currency not in SYMBOLS:
            raise ValueError(f"unknown currency {self.currency!r}; known: {', '.join(sorted(SYMBOLS))}")
        if not isinstance(self.cents, int) or isinstance(self.cents, bool):
            raise TypeError(f"cents must be an int, got {type(self.cents).__name__}")

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.currency]

    def _same(self, other: Amount) -> None:
        if self.currency != other.currency:
            raise ValueError(f"cannot combine {self.currency} and {other.currency}")

    def __add__(self, other: Amount) -> Amount:
        self._same(other)
        return Amount(self.cents + other.cents, self.currency)

    def __sub__(self, other: Amount) -> Amount:
        self._same(other)
        return Amount(self.cents - other.cents, self.currency)

    def __neg__(self) -> Amount:
        return Amount(-self.cents, self.currency)

    def split(self, ways: int) -> list[Amount]:
        """`ways` amounts that add up to this one exactly; the first ones get the odd cents."""
        if ways < 1:
            raise ValueError(f"ways must be at least 1, got {ways}")
        share, odd = divmod(self.cents, ways)
        return [Amount(share + (1 if i < odd else 0), self.currency) for i in range(ways)]
