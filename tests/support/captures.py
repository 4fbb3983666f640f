"""The real CLI request bodies in ../shared/captures (read when present; their text is never copied here)."""

from __future__ import annotations

import os

CAPTURES_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "captures"))


def capture_files(cli: str) -> list[str]:
    """Sorted paths of one CLI's captured bodies (e.g. "codex"); [] when the captures are absent."""
    folder = os.path.join(CAPTURES_DIR, cli)
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json"))
