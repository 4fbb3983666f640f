#!/bin/bash
# The reference fix: tests/config.json's `patch`, applied in /testbed.
set -euo pipefail
cd /testbed
git -c safe.directory='*' apply --whitespace=nowarn <<'POLAR_GOLD_PATCH'
diff --git a/cfgmerge/merge.py b/cfgmerge/merge.py
index 2d1de02..4c99a95 100644
--- a/cfgmerge/merge.py
+++ b/cfgmerge/merge.py
@@ -2,6 +2,7 @@
 
 from __future__ import annotations
 
+import copy
 from typing import Any
 
 DELETE = object()  # an override value that removes the key
@@ -9,13 +10,13 @@ DELETE = object()  # an override value that removes the key
 
 def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
     """`base` with `override` on top: nested dicts are merged key by key, any other value (lists included) replaces
-    the base's, and DELETE removes the key. Returns the merged dict."""
-    merged = base
+    the base's, and DELETE removes the key. Returns a new dict; neither input is changed."""
+    merged = copy.deepcopy(base)  # defaults and profiles are shared by every merge that starts from them
     for key, value in override.items():
         if value is DELETE:
             merged.pop(key, None)
         elif isinstance(value, dict) and isinstance(merged.get(key), dict):
             merged[key] = deep_merge(merged[key], value)
         else:
-            merged[key] = value
+            merged[key] = copy.deepcopy(value)
     return merged
POLAR_GOLD_PATCH
