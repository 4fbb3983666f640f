from pagekit import get_page, render_nav


def test_render_middle_page():
    page = get_page(list(range(95)), 5)
    assert render_nav(page) == "« 1 2 3 4 [5] 6 7 … 10 »"


def test_render_first_page_has_no_back_arrow():
    page = get_page(list(range(35)), 1)
    assert render_nav(page) == "[1] 2 3 4 »"
