from pager import page, page_count


def test_page_count_rounds_up():
    assert page_count(7, 2) == 4


def test_first_page():
    assert page(list("abcdefg"), 1, 2) == ["a", "b"]
