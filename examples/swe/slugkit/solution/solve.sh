#!/bin/bash
# The reference fix: tests/config.json's `patch`, applied in /testbed.
set -euo pipefail
cd /testbed
git -c safe.directory='*' apply --whitespace=nowarn <<'POLAR_GOLD_PATCH'
diff --git a/slugkit/slug.py b/slugkit/slug.py
index 47b727a..385c4c2 100644
--- a/slugkit/slug.py
+++ b/slugkit/slug.py
@@ -7,7 +7,7 @@ from slugkit.normalize import words
 DEFAULT_SEPARATOR = "-"
 
 
-def slugify(text: str, separator: str = "_", max_length: int | None = None,
+def slugify(text: str, separator: str = DEFAULT_SEPARATOR, max_length: int | None = None,
             stopwords: frozenset[str] = frozenset()) -> str:
     """The slug of `text`: its ASCII words (slugkit.normalize.words) without `stopwords`, joined by `separator`
     (a hyphen unless told otherwise). With `max_length`, whole words are dropped from the end until it fits; a first
POLAR_GOLD_PATCH
