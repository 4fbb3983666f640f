from pricing import invoice_total, quote_total, refund_total

CART = [{"price": 10.0, "qty": 2}, {"price": 2.5, "qty": 4}]


def test_invoice_total():
    assert invoice_total(CART) == 36.0


def test_quote_total():
    assert quote_total(CART, 5.0) == 30.0


def test_refund_total():
    assert refund_total(CART) == -36.0
