import pytest

from moneyfmt import Amount, AmountError, format_amount, parse_amount


def test_symbols_and_separators():
    assert parse_amount("$1,234.50") == Amount(123450)
    assert parse_amount("€0.99") == Amount(99, "EUR")
    assert parse_amount("12.5", currency="GBP") == Amount(1250, "GBP")


@pytest.mark.parametrize("text", ["", "$", "1,23.00", "1.234", "$$1", "12,3456"])
def test_not_amounts(text):
    with pytest.raises(AmountError):
        parse_amount(text)


def test_round_trip():
    for cents in (0, 7, 99, 100, 123456789):
        assert parse_amount(format_amount(Amount(cents))) == Amount(cents)
