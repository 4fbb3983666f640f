"""Totals for invoices, quotes and refunds. Prices carry 20 % tax, rounded to cents."""


def invoice_total(items):
    """What the customer pays for `items` (dicts with "price" and "qty"), tax included."""
    subtotal = 0.0
    for item in items:
        subtotal += item["price"] * item["qty"]
    tax = round(subtotal * 0.2, 2)
    return round(subtotal + tax, 2)


def quote_total(items, discount):
    """An invoice total with `discount` taken off before tax."""
    subtotal = 0.0
    for item in items:
        subtotal += item["price"] * item["qty"]
    subtotal -= discount
    tax = round(subtotal * 0.2, 2)
    return round(subtotal + tax, 2)


def refund_total(items):
    """What the customer gets back for returning `items`: the invoice total, negative."""
    subtotal = 0.0
    for item in items:
        subtotal += item["price"] * item["qty"]
    tax = round(subtotal * 0.2, 2)
    return -round(subtotal + tax, 2)
