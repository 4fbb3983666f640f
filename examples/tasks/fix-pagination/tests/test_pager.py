"""fix-pagination: every test fails on the start state (both off-by-one bugs, no argument checks)."""

import importlib

import pytest

ITEMS = list(range(1, 11))  # 1..10: four pages of 3 (the last holds one item), two pages of 5


@pytest.fixture
def pager():
    return importlib.import_module("pager")


def test_page_count_rounds_up(pager):
    assert pager.page_count(10, 3) == 4
    assert pager.page_count(1, 10) == 1
    assert pager.page_count(9, 3) == 3
    assert pager.page_count(0, 5) == 0


def test_first_page(pager):
    assert pager.page(ITEMS, 1, 3) == [1, 2, 3]


def test_last_page_is_partial(pager):
    assert pager.page(ITEMS, 4, 3) == [10]


def test_past_the_last_page_is_empty(pager):
    assert pager.page(ITEMS, 2, 5) == [6, 7, 8, 9, 10]
    assert pager.page(ITEMS, 3, 5) == []


def test_bad_arguments_raise_value_error(pager):
    with pytest.raises(ValueError):
        pager.page(ITEMS, 0, 3)
    with pytest.raises(ValueError):
        pager.page(ITEMS, 1, 0)
    with pytest.raises(ValueError):
        pager.page_count(10, 0)
