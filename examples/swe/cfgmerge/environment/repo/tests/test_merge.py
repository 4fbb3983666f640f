from cfgmerge import deep_merge
from cfgmerge.merge import DELETE


def test_nested_keys_merge(defaults):
    merged = deep_merge(defaults, {"db": {"pool": {"size": 10}}})
    assert merged["db"] == {"host": "localhost", "pool": {"size": 10, "timeout": 30}}


def test_lists_and_scalars_replace(defaults):
    merged = deep_merge(defaults, {"tags": ["x"], "debug": True})
    assert merged["tags"] == ["x"] and merged["debug"] is True


def test_delete_removes_a_key(defaults):
    assert "debug" not in deep_merge(defaults, {"debug": DELETE})
