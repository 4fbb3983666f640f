from verlite import latest, parse, sort_versions


def test_sort():
    assert [str(v) for v in sort_versions(["1.10.0", "1.2.0", "1.2.0-rc.1"])] == ["1.2.0-rc.1", "1.2.0", "1.10.0"]


def test_latest_in_range():
    tags = ["0.9.0", "1.0.0", "1.4.2", "2.0.0-rc.1", "2.0.0", "2.1.0"]
    assert latest(tags, "<2.0.0") == parse("1.4.2")
    assert latest(tags) == parse("2.1.0")
    assert latest(["3.0.0-beta.1"]) is None
