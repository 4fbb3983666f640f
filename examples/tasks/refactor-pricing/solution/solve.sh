#!/usr/bin/env bash
# Reference solution of refactor-pricing (cwd /app): one helper for the sum, one for the tax.
set -euo pipefail
cat > pricing.py <<'PY'
"""Totals for invoices, quotes and refunds. Prices carry 20 % tax, rounded to cents."""

TAX_RATE = 0.2


def subtotal(items):
    """The sum of price * qty over `items` (dicts with "price" and "qty")."""
    return sum(item["price"] * item["qty"] for item in items)


def with_tax(amount):
    """`amount` plus tax, the tax and the result rounded to cents."""
    return round(amount + round(amount * TAX_RATE, 2), 2)


def invoice_total(items):
    """What the customer pays for `items`, tax included."""
    return with_tax(subtotal(items))


def quote_total(items, discount):
    """An invoice total with `discount` taken off before tax."""
    return with_tax(subtotal(items) - discount)


def refund_total(items):
    """What the customer gets back for returning `items`: the invoice total, negative."""
    return -with_tax(subtotal(items))
PY
