from verlite import Spec, satisfies


def test_ranges():
    assert satisfies("1.5.2", ">=1.2.0,<2.0.0")
    assert not satisfies("2.0.0", ">=1.2.0,<2.0.0")
    assert not satisfies("1.3.0", "!=1.3.0")


def test_prereleases_only_when_asked():
    assert not satisfies("2.0.0-rc.1", ">=1.0.0")
    assert "2.0.0-rc.1" in Spec.parse(">=1.0.0", prereleases=True)
    assert satisfies("2.0.0-rc.2", ">=2.0.0-rc.1")
