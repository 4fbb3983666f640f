"""moneyfmt: money amounts as whole cents, written and read the way invoices show them (`$1,234.50`)."""

from moneyfmt.amount import Amount
from moneyfmt.format import format_amount
from moneyfmt.parse import AmountError, parse_amount

__all__ = ["Amount", "AmountError", "format_amount", "parse_amount"]
__version__ = "0.9.0"
