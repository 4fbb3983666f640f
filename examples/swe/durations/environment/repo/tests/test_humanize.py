import pytest

from durations import approximate


@pytest.mark.parametrize("seconds, text", [
    (30, "less than a minute"),
    (60, "1 minute"),
    (5400, "about 2 hours"),
    (7200, "2 hours"),
    (3 * 86400 + 100, "about 3 days"),
    (14 * 86400, "2 weeks"),
])
def test_approximate(seconds, text):
    assert approximate(seconds) == text


def test_without_prefix():
    assert approximate(5400, prefix=False) == "2 hours"
