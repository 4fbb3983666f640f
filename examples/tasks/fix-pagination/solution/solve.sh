#!/usr/bin/env bash
# Reference solution of fix-pagination (cwd /app): round the page count up, make page numbers 1-based, check
# the arguments.
set -euo pipefail
cat > pager.py <<'PY'
"""Split a list into numbered pages. Page numbers start at 1."""


def page_count(total, per_page):
    """How many pages `total` items fill, `per_page` items to a page (0 items: 0 pages).

    ValueError when per_page is below 1.
    """
    if per_page < 1:
        raise ValueError(f"per_page must be at least 1, got {per_page}")
    return -(-total // per_page)


def page(items, number, per_page):
    """The items on page `number` (1 is the first page); an empty list past the last page.

    ValueError when number or per_page is below 1.
    """
    if number < 1:
        raise ValueError(f"page numbers start at 1, got {number}")
    if per_page < 1:
        raise ValueError(f"per_page must be at least 1, got {per_page}")
    start = (number - 1) * per_page
    return items[start:start + per_page]
PY
