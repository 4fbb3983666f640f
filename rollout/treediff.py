"""final.diff: a unified diff of a sample's start state against its final /app (text files; binary or large files
named, the whole cut at DIFF_TOTAL_LIMIT)."""

from __future__ import annotations

import contextlib
import difflib
import os
from pathlib import Path

DIFF_FILE_LIMIT = 1 << 20
DIFF_TOTAL_LIMIT = 16 << 20


def _files(root: Path | None) -> dict[str, Path]:
    out: dict[str, Path] = {}
    if root is None or not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git" or dirpath != str(root))
        for name in filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = p
    return out


def _text(path: Path) -> list[str] | None:
    try:
        if path.is_symlink():
            return [f"-> {os.readlink(path)}\n"]
        if path.stat().st_size > DIFF_FILE_LIMIT:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def tree_diff(start: Path | None, final: Path) -> str:
    """A unified diff of the start state against the final /app (text files; binary or large files named)."""
    a, b = _files(start), _files(final)
    out: list[str] = []
    size = 0
    for rel in sorted(set(a) | set(b)):
        old, new = (_text(a[rel]) if rel in a else []), (_text(b[rel]) if rel in b else [])
        if rel in a and rel in b and old is not None and old == new:
            continue
        if old is None or new is None:
            if rel in a and rel in b:
                with contextlib.suppress(OSError):
                    if a[rel].read_bytes() == b[rel].read_bytes():
                        continue
            out.append(f"Binary or large files a/{rel} and b/{rel} differ\n")
            continue
        chunk = list(difflib.unified_diff(old, new, f"a/{rel}" if rel in a else "/dev/null",
                                          f"b/{rel}" if rel in b else "/dev/null"))
        chunk = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in chunk]
        size += sum(map(len, chunk))
        if size > DIFF_TOTAL_LIMIT:
            out.append(f"... diff cut at {DIFF_TOTAL_LIMIT} bytes\n")
            break
        out.extend(chunk)
    return "".join(out)
