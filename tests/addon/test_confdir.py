"""The CA directory is made private whoever created it (no sockets)."""

from __future__ import annotations

import os
import stat

import pytest

from polar.addon.confdir import secure_confdir

pytestmark = pytest.mark.unit


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_1_1_an_open_confdir_and_key_are_tightened_and_each_change_is_named(tmp_path):
    d = tmp_path / "conf"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    for name, m in (("mitmproxy-ca.pem", 0o644), ("mitmproxy-ca.p12", 0o600), ("mitmproxy-ca-cert.pem", 0o644)):
        (d / name).write_text("x")
        os.chmod(d / name, m)
    changes = secure_confdir(str(d))
    assert mode(d) == 0o700 and mode(d / "mitmproxy-ca.pem") == 0o600
    assert mode(d / "mitmproxy-ca-cert.pem") == 0o644  # public: left alone
    assert len(changes) == 2 and "0755" in changes[0] and "mitmproxy-ca.pem" in changes[1]
    assert secure_confdir(str(d)) == []  # nothing to do: nothing logged


def test_1_2_a_missing_confdir_is_left_to_mitmproxy(tmp_path):
    assert secure_confdir(str(tmp_path / "absent")) == []
