import pytest

from pagekit import page_window


def test_small_bar_shows_every_page():
    assert page_window(2, 4) == [1, 2, 3, 4]


def test_gaps_on_both_sides():
    assert page_window(10, 20) == [1, None, 8, 9, 10, 11, 12, None, 20]


def test_a_one_page_gap_shows_the_page():
    assert page_window(5, 9) == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_current_out_of_range():
    with pytest.raises(ValueError):
        page_window(6, 5)
