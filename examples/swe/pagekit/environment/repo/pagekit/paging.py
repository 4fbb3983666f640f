"""Splitting a sequence into numbered pages (numbers start at 1)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any


class PageError(ValueError):
    """A page number or page size that the collection does not have."""


def page_count(total: int, per_page: int) -> int:
    """How many pages `total` items fill at `per_page` a page. An empty collection still has one (empty) page, so
    that a listing can always show page 1."""
    if per_page < 1:
        raise PageError(f"per_page must be at least 1, got {per_page}")
    if total < 0:
        raise PageError(f"total must not be negative, got {total}")
    if total == 0:
        return 1
    return total // per_page + 1


@dataclass(frozen=True)
class Page:
    """One page: its number, its items and how many pages there are in all."""

    number: int
    items: list[Any]
    total_pages: int

    @property
    def has_next(self) -> bool:
        return self.number < self.total_pages

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def next_number(self) -> int | None:
        return self.number + 1 if self.has_next else None

    @property
    def previous_number(self) -> int | None:
        return self.number - 1 if self.has_previous else None


def get_page(items: Sequence[Any], number: int, per_page: int = 10) -> Page:
    """Page `number` of `items`; PageError when there is no such page."""
    pages = page_count(len(items), per_page)
    if not 1 <= number <= pages:
        raise PageError(f"page {number} is out of range 1..{pages}")
    start = (number - 1) * per_page
    return Page(number, list(items[start:start + per_page]), pages)


def iter_pages(items: Sequence[Any], per_page: int = 10) -> Iterator[Page]:
    """Every page of `items`, first to last."""
    for number in range(1, page_count(len(items), per_page) + 1):
        yield get_page(items, number, per_page)
