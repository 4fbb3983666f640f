#!/bin/bash
# The reference fix: tests/config.json's `patch`, applied in /testbed.
set -euo pipefail
cd /testbed
git -c safe.directory='*' apply --whitespace=nowarn <<'POLAR_GOLD_PATCH'
diff --git a/durations/format.py b/durations/format.py
index 9e41f3e..6451fa0 100644
--- a/durations/format.py
+++ b/durations/format.py
@@ -19,6 +19,8 @@ def format_duration(seconds: int, max_parts: int | None = None, compact: bool =
         count, left = divmod(left, size)
         if count:
             parts.append(f"{count}{symbol}")
+    if not parts:  # nothing in any unit: still a duration that parse_duration reads back
+        parts = [f"0{UNITS[-1][0]}"]
     if max_parts is not None:
         parts = parts[:max_parts]
     return ("" if compact else " ").join(parts)
POLAR_GOLD_PATCH
