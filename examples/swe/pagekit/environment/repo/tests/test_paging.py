import pytest

from pagekit import PageError, get_page, iter_pages, page_count


def test_page_count_partial_last_page():
    assert page_count(21, 10) == 3
    assert page_count(1, 10) == 1


def test_empty_collection_has_one_page():
    assert page_count(0, 10) == 1
    page = get_page([], 1)
    assert page.items == [] and not page.has_next and not page.has_previous


def test_get_page_slices_items():
    items = list(range(25))
    assert get_page(items, 3, per_page=10).items == [20, 21, 22, 23, 24]
    assert get_page(items, 2, per_page=10).previous_number == 1


def test_out_of_range_page_is_an_error():
    with pytest.raises(PageError):
        get_page(list(range(5)), 2, per_page=10)
    with pytest.raises(PageError):
        get_page(list(range(5)), 0)


def test_bad_sizes_are_errors():
    with pytest.raises(PageError):
        page_count(5, 0)
    with pytest.raises(PageError):
        page_count(-1, 10)


def test_iter_pages_covers_every_item_once():
    items = list(range(23))
    pages = list(iter_pages(items, per_page=5))
    assert [p.number for p in pages] == [1, 2, 3, 4, 5]
    assert [x for p in pages for x in p.items] == items
