#!/bin/bash
# The reference fix: tests/config.json's `patch`, applied in /testbed.
set -euo pipefail
cd /testbed
git -c safe.directory='*' apply --whitespace=nowarn <<'POLAR_GOLD_PATCH'
diff --git a/moneyfmt/format.py b/moneyfmt/format.py
index 10cd866..b24880b 100644
--- a/moneyfmt/format.py
+++ b/moneyfmt/format.py
@@ -13,7 +13,9 @@ def group_thousands(digits: str, sep: str = ",") -> str:
 
 
 def format_amount(amount: Amount, symbol: bool = True, thousands: str = ",") -> str:
-    """`Amount(123450)` → `$1,234.50`; without `symbol`, `1,234.50`; `thousands=""` leaves the separators out."""
-    whole, cents = divmod(amount.cents, 100)
+    """`Amount(123450)` → `$1,234.50`; without `symbol`, `1,234.50`; `thousands=""` leaves the separators out.
+    A negative amount starts with a minus sign: `-$5.00`."""
+    sign = "-" if amount.cents < 0 else ""  # before the symbol: -$5.00
+    whole, cents = divmod(abs(amount.cents), 100)
     text = f"{group_thousands(str(whole), thousands)}.{cents:02d}"
-    return f"{amount.symbol}{text}" if symbol else text
+    return f"{sign}{amount.symbol}{text}" if symbol else f"{sign}{text}"
diff --git a/moneyfmt/parse.py b/moneyfmt/parse.py
index 302af1a..b24c377 100644
--- a/moneyfmt/parse.py
+++ b/moneyfmt/parse.py
@@ -7,7 +7,7 @@ import re
 from moneyfmt.amount import SYMBOLS, Amount
 
 BY_SYMBOL = {symbol: code for code, symbol in SYMBOLS.items()}
-AMOUNT = re.compile(r"(?P<symbol>[$€£])?(?P<whole>\d{1,3}(?:,\d{3})*|\d+)(?:\.(?P<frac>\d{1,2}))?")
+AMOUNT = re.compile(r"(?P<sign>-)?(?P<symbol>[$€£])?(?P<whole>\d{1,3}(?:,\d{3})*|\d+)(?:\.(?P<frac>\d{1,2}))?")
 
 
 class AmountError(ValueError):
@@ -16,7 +16,8 @@ class AmountError(ValueError):
 
 def parse_amount(text: str, currency: str | None = None) -> Amount:
     """The Amount `text` writes. The currency is the symbol's, else `currency`, else USD; a symbol that disagrees
-    with `currency` is an error. At most two decimals; thousands separators only in groups of three."""
+    with `currency` is an error. A minus sign
+    may lead (`-$5.00`, `-5.00`). At most two decimals; thousands separators only in groups of three."""
     match = AMOUNT.fullmatch(text.strip())
     if match is None:
         raise AmountError(f"not an amount: {text!r}")
@@ -25,4 +26,5 @@ def parse_amount(text: str, currency: str | None = None) -> Amount:
         raise AmountError(f"{text!r} is in {code}, not {currency}")
     whole = int(match["whole"].replace(",", ""))
     frac = int((match["frac"] or "0").ljust(2, "0"))
-    return Amount(whole * 100 + frac, code or currency or "USD")
+    cents = whole * 100 + frac
+    return Amount(-cents if match["sign"] else cents, code or currency or "USD")
POLAR_GOLD_PATCH
