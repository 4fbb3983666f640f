"""Session attribution from proxy credentials (no sockets)."""

from __future__ import annotations

import base64

import pytest

from polar.addon.sessions import proxy_user

pytestmark = pytest.mark.unit


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("credentials,user", [
    ("s1:x", "s1"), ("alice@lab:1:x", "alice@lab:1"),  # clients decode %3A before building the header
    ("sess%2F42:x", "sess/42"), ("only-user", "only-user"), (":x", None),
])
def test_1_1_the_user_name_is_everything_before_the_last_colon(credentials, user):
    assert proxy_user(basic(credentials)) == user


def test_1_2_no_or_foreign_credentials_name_no_session():
    assert proxy_user(None) is None and proxy_user("Bearer abc") is None and proxy_user("Basic !!") is None
