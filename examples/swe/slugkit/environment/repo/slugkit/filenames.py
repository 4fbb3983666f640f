"""File names from titles: the slug of the name, the extension kept, safe on every common file system."""

from __future__ import annotations

from slugkit.normalize import words
from slugkit.slug import slugify

RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}


def split_extension(title: str) -> tuple[str, str]:
    """(`Report Q3`, `pdf`) for `Report Q3.pdf`: the extension is the last dot's one ASCII word, if it has one."""
    stem, dot, ext = title.rpartition(".")
    if not dot or not stem.strip() or words(ext) != [ext.lower()] or len(ext) > 8:
        return title, ""
    return stem, ext.lower()


def safe_filename(title: str, max_length: int = 64) -> str:
    """`Report: Q3/2024.PDF` → `report-q3-2024.pdf`; a name Windows reserves gets a trailing `-file`."""
    stem, ext = split_extension(title)
    room = max_length - (len(ext) + 1 if ext else 0)
    slug = slugify(stem, separator="-", max_length=max(room, 1)) or "file"
    if slug in RESERVED:
        slug += "-file"
    return f"{slug}.{ext}" if ext else slug
