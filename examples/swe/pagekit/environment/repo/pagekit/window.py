"""Which page numbers a navigation bar shows: the current page, its neighbours, the first and the last, with gaps
(None) where numbers are left out."""

from __future__ import annotations


def page_window(current: int, total_pages: int, radius: int = 2) -> list[int | None]:
    """The page numbers to show around `current`: `radius` on each side, always page 1 and the last page, None for a
    gap of more than one page (a gap of exactly one page shows that page instead)."""
    if total_pages < 1:
        raise ValueError(f"total_pages must be at least 1, got {total_pages}")
    if not 1 <= current <= total_pages:
        raise ValueError(f"current page {current} is out of range 1..{total_pages}")
    if radius < 0:
        raise ValueError(f"radius must not be negative, got {radius}")
    low = max(1, current - radius)
    high = min(total_pages, current + radius)
    shown: list[int | None] = []
    if low > 1:
        shown.append(1)
        if low == 3:
            shown.append(2)
        elif low > 3:
            shown.append(None)
    shown.extend(range(low, high + 1))
    if high < total_pages:
        if high == total_pages - 2:
            shown.append(total_pages - 1)
        elif high < total_pages - 2:
            shown.append(None)
        shown.append(total_pages)
    return shown
