"""pagekit: split a collection into numbered pages and draw the page links under it."""

from pagekit.paging import Page, PageError, get_page, iter_pages, page_count
from pagekit.render import render_nav
from pagekit.window import page_window

__all__ = ["Page", "PageError", "get_page", "iter_pages", "page_count", "page_window", "render_nav"]
__version__ = "0.4.1"
