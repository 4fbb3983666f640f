import pytest

from moneyfmt import Amount


def test_arithmetic_keeps_currency():
    assert Amount(150) + Amount(250) == Amount(400)
    assert Amount(100, "EUR") - Amount(30, "EUR") == Amount(70, "EUR")


def test_mixed_currencies_are_an_error():
    with pytest.raises(ValueError):
        Amount(1) + Amount(1, "EUR")


def test_split_adds_up():
    parts = Amount(1000).split(3)
    assert [p.cents for p in parts] == [334, 333, 333]
