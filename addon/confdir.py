"""The CA directory's permissions: the directory 0700 and the CA key files 0600, whoever created them (mitmproxy
creates a new `confdir` 0755). Standard library only: the fail-closed path in polar_addon.py loads it by path."""

from __future__ import annotations

import os
import stat

# Files in a mitmproxy confdir that hold the CA's private key (the *-cert.* files are public).
KEY_FILES = ("mitmproxy-ca.pem", "mitmproxy-ca.p12")


def secure_confdir(confdir: str) -> list[str]:
    """Tighten what is too open; returns one line per change made (empty when nothing had to change). A confdir that
    does not exist yet is left to mitmproxy, which creates it."""
    path = os.path.expanduser(confdir)
    changes: list[str] = []
    if not os.path.isdir(path):
        return changes
    for target, mode in [(path, 0o700)] + [(os.path.join(path, name), 0o600) for name in KEY_FILES]:
        try:
            current = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            continue
        if current & 0o077:
            os.chmod(target, mode)
            changes.append(f"{target} was {current:04o}, made it {mode:04o}")
    return changes
