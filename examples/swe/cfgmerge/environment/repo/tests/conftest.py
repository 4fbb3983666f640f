import pytest


@pytest.fixture
def defaults():
    return {"db": {"host": "localhost", "pool": {"size": 5, "timeout": 30}}, "debug": False, "tags": ["base"]}


@pytest.fixture
def profiles():
    return {"prod": {"db": {"host": "db.internal", "pool": {"size": 50}}},
            "dev": {"debug": True, "tags": ["dev"]}}
