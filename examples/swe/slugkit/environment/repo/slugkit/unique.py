"""Unique slugs within one site: the second `hello-world` becomes `hello-world-2`."""

from __future__ import annotations

from slugkit.slug import DEFAULT_SEPARATOR, slugify


class UniqueSlugger:
    """Hands out slugs that were not handed out before (or are in `taken`)."""

    def __init__(self, taken: set[str] | None = None, max_length: int | None = None) -> None:
        self.taken: set[str] = set(taken or ())
        self.max_length = max_length

    def slug(self, text: str) -> str:
        """A fresh slug for `text`: its slugify() form, else that form with `-2`, `-3`, … appended."""
        base = slugify(text, max_length=self.max_length) or "untitled"
        candidate, n = base, 1
        while candidate in self.taken:
            n += 1
            suffix = f"{DEFAULT_SEPARATOR}{n}"
            stem = base if self.max_length is None else base[:self.max_length - len(suffix)]
            candidate = f"{stem}{suffix}"
        self.taken.add(candidate)
        return candidate

    def release(self, slug: str) -> None:
        """Forget `slug`, so it can be handed out again."""
        self.taken.discard(slug)
