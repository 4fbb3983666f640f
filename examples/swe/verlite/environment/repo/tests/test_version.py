import pytest

from verlite import Version, VersionError, parse


def test_parse_and_str():
    assert parse("v1.4.0-rc.2") == Version(1, 4, 0, "rc.2")
    assert str(parse("10.0.3")) == "10.0.3"


def test_order():
    assert parse("1.0.0-alpha") < parse("1.0.0-alpha.1") < parse("1.0.0-beta.2") < parse("1.0.0-beta.11")
    assert parse("1.0.0-rc.1") < parse("1.0.0") < parse("1.0.1") < parse("1.10.0")


@pytest.mark.parametrize("text", ["1.0", "1.0.0.0", "one.two.three", "1.0.0-"])
def test_not_versions(text):
    with pytest.raises(VersionError):
        parse(text)
