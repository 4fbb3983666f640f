"""Split a list into numbered pages. Page numbers start at 1."""


def page_count(total, per_page):
    """How many pages `total` items fill, `per_page` items to a page (0 items: 0 pages).

    ValueError when per_page is below 1.
    """
    return total // per_page


def page(items, number, per_page):
    """The items on page `number` (1 is the first page); an empty list past the last page.

    ValueError when number or per_page is below 1.
    """
    start = number * per_page
    return items[start:start + per_page]
