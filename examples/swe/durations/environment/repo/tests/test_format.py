import pytest

from durations import format_duration, parse_duration


def test_largest_units_first():
    assert format_duration(5400) == "1h 30m"
    assert format_duration(694861) == "1w 1d 1h 1m 1s"


def test_max_parts_truncates():
    assert format_duration(3 * 86400 + 7199, max_parts=2) == "3d 1h"


def test_compact_round_trips():
    for seconds in (1, 59, 61, 3600, 90061):
        assert parse_duration(format_duration(seconds, compact=True)) == seconds


def test_negative_is_an_error():
    with pytest.raises(ValueError):
        format_duration(-1)
