import pytest

from cfgmerge import get_path, set_path


def test_get_and_default(defaults):
    assert get_path(defaults, "db.pool.size") == 5
    assert get_path(defaults, "db.port", 5432) == 5432
    with pytest.raises(KeyError):
        get_path(defaults, "db.host.name")


def test_set_makes_tables():
    config = {}
    set_path(config, "cache.redis.url", "redis://x")
    assert config == {"cache": {"redis": {"url": "redis://x"}}}
