#!/bin/bash
# The reference fix: tests/config.json's `patch`, applied in /testbed.
set -euo pipefail
cd /testbed
git -c safe.directory='*' apply --whitespace=nowarn <<'POLAR_GOLD_PATCH'
diff --git a/verlite/__init__.py b/verlite/__init__.py
index 9822662..12b06aa 100644
--- a/verlite/__init__.py
+++ b/verlite/__init__.py
@@ -2,7 +2,7 @@
 
 from verlite.ordering import latest, sort_versions
 from verlite.spec import Spec, satisfies
-from verlite.version import Version, VersionError, parse
+from verlite.version import Version, VersionError, bump, parse
 
-__all__ = ["Spec", "Version", "VersionError", "latest", "parse", "satisfies", "sort_versions"]
+__all__ = ["Spec", "Version", "VersionError", "bump", "latest", "parse", "satisfies", "sort_versions"]
 __version__ = "0.6.0"
diff --git a/verlite/version.py b/verlite/version.py
index ecd2587..97887e5 100644
--- a/verlite/version.py
+++ b/verlite/version.py
@@ -53,3 +53,27 @@ def parse(text: str | Version) -> Version:
         raise VersionError(f"not a version: {text!r}")
     major, minor, patch, pre = match.groups()
     return Version(int(major), int(minor), int(patch), pre or "")
+
+
+PARTS = ("major", "minor", "patch")
+
+
+def bump(version: str | Version, part: str, pre: str = "") -> Version:
+    """The next `part` ("major", "minor" or "patch") release after `version`: the part goes up by one and the parts
+    below it go to 0. A pre-release is released by its own bump (`1.3.0-rc.1` → `1.3.0` for "minor" or "patch"
+    when those parts are already 0 below), as semantic versioning's tools do. `pre` makes the result itself a
+    pre-release (`2.0.0-rc.1`)."""
+    v = parse(version)
+    if part not in PARTS:
+        raise VersionError(f"unknown part {part!r}; expected one of {', '.join(PARTS)}")
+    if pre and not re.fullmatch(r"[0-9A-Za-z.-]+", pre):
+        raise VersionError(f"not a pre-release: {pre!r}")
+    if part == "major":
+        releases = v.is_prerelease and v.minor == 0 and v.patch == 0
+        nxt = Version(v.major if releases else v.major + 1, 0, 0)
+    elif part == "minor":
+        releases = v.is_prerelease and v.patch == 0
+        nxt = Version(v.major, v.minor if releases else v.minor + 1, 0)
+    else:
+        nxt = Version(v.major, v.minor, v.patch if v.is_prerelease else v.patch + 1)
+    return Version(nxt.major, nxt.minor, nxt.patch, pre)
POLAR_GOLD_PATCH
