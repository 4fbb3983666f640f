import pytest

from durations import DurationError, parse_duration


def test_parts_add_up():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2 days 3h") == 2 * 86400 + 3 * 3600


def test_bare_number_is_seconds():
    assert parse_duration(" 42 ") == 42


def test_aliases():
    assert parse_duration("5 mins 10 secs") == 310


@pytest.mark.parametrize("text", ["", "1x", "1h1h", "h", "1h 30"])
def test_bad_text(text):
    with pytest.raises(DurationError):
        parse_duration(text)
