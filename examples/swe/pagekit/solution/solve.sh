#!/bin/bash
# The reference fix: tests/config.json's `patch`, applied in /testbed.
set -euo pipefail
cd /testbed
git -c safe.directory='*' apply --whitespace=nowarn <<'POLAR_GOLD_PATCH'
diff --git a/pagekit/paging.py b/pagekit/paging.py
index da5deb9..96f9fdb 100644
--- a/pagekit/paging.py
+++ b/pagekit/paging.py
@@ -20,7 +20,7 @@ def page_count(total: int, per_page: int) -> int:
         raise PageError(f"total must not be negative, got {total}")
     if total == 0:
         return 1
-    return total // per_page + 1
+    return (total + per_page - 1) // per_page
 
 
 @dataclass(frozen=True)
POLAR_GOLD_PATCH
