from moneyfmt import Amount, format_amount


def test_thousands_and_cents():
    assert format_amount(Amount(123456789)) == "$1,234,567.89"
    assert format_amount(Amount(5)) == "$0.05"


def test_options():
    assert format_amount(Amount(123450, "EUR"), symbol=False) == "1,234.50"
    assert format_amount(Amount(123450, "GBP"), thousands="") == "£1234.50"
