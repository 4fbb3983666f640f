"""A plain-text navigation bar for a page: `« 1 … 4 [5] 6 … 9 »`."""

from __future__ import annotations

from pagekit.paging import Page
from pagekit.window import page_window

GAP = "…"


def render_nav(page: Page, radius: int = 2) -> str:
    """The bar under `page`: « when there is a previous page, the window of numbers with the current one in
    brackets, » when there is a next page."""
    parts: list[str] = []
    if page.has_previous:
        parts.append("«")
    for number in page_window(page.number, page.total_pages, radius):
        if number is None:
            parts.append(GAP)
        elif number == page.number:
            parts.append(f"[{number}]")
        else:
            parts.append(str(number))
    if page.has_next:
        parts.append("»")
    return " ".join(parts)
