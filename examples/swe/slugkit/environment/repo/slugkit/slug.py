"""slugify: a title to a slug."""

from __future__ import annotations

from slugkit.normalize import words

DEFAULT_SEPARATOR = "-"


def slugify(text: str, separator: str = "_", max_length: int | None = None,
            stopwords: frozenset[str] = frozenset()) -> str:
    """The slug of `text`: its ASCII words (slugkit.normalize.words) without `stopwords`, joined by `separator`
    (a hyphen unless told otherwise). With `max_length`, whole words are dropped from the end until it fits; a first
    word longer than that is cut."""
    if not separator or any(ch.isalnum() for ch in separator):
        raise ValueError(f"separator must be non-empty punctuation, got {separator!r}")
    kept = [w for w in words(text) if w not in stopwords]
    slug = separator.join(kept)
    if max_length is not None:
        if max_length < 1:
            raise ValueError(f"max_length must be at least 1, got {max_length}")
        while len(slug) > max_length and len(kept) > 1:
            kept.pop()
            slug = separator.join(kept)
        slug = slug[:max_length]
    return slug
