"""Version: `MAJOR.MINOR.PATCH` with an optional pre-release (`1.4.0-rc.2`), ordered as semantic versions are."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?")


class VersionError(ValueError):
    """Text that is not a version."""


def _pre_key(pre: str) -> tuple:
    # numeric identifiers sort numerically and before alphanumeric ones (semver §11)
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))


@total_ordering
@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    pre: str = ""

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{self.pre}" if self.pre else core

    @property
    def is_prerelease(self) -> bool:
        return bool(self.pre)

    def _key(self) -> tuple:
        # a release sorts after every pre-release of the same core
        return (self.major, self.minor, self.patch, (1, ()) if not self.pre else (0, _pre_key(self.pre)))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()


def parse(text: str | Version) -> Version:
    """The Version `text` writes (a leading `v` is allowed); a Version is returned as it is."""
    if isinstance(text, Version):
        return text
    match = VERSION.fullmatch(text.strip())
    if match is None:
        raise VersionError(f"not a version: {text!r}")
    major, minor, patch, pre = match.groups()
    return Version(int(major), int(minor), int(patch), pre or "")
