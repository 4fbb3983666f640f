"""Ranges: `>=1.2.0,<2.0.0`, `==1.4.1`, `!=1.3.0`, matched against a version."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

from verlite.version import Version, VersionError, parse

OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
       "!=": operator.ne}
CLAUSE = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*(\S+?)\s*")


@dataclass(frozen=True)
class Spec:
    """Comma-separated clauses, all of which must hold. Pre-releases match only when `prereleases` is set or a
    clause names a pre-release of the same core."""

    clauses: tuple[tuple[str, Version], ...]
    prereleases: bool = False

    @classmethod
    def parse(cls, text: str, prereleases: bool = False) -> Spec:
        clauses = []
        for part in text.split(","):
            match = CLAUSE.fullmatch(part)
            if match is None:
                raise VersionError(f"not a range clause: {part.strip()!r} in {text!r}")
            clauses.append((match[1], parse(match[2])))
        return cls(tuple(clauses), prereleases)

    def __contains__(self, version: str | Version) -> bool:
        v = parse(version)
        if v.is_prerelease and not self.prereleases and not any(
                c.is_prerelease and (c.major, c.minor, c.patch) == (v.major, v.minor, v.patch)
                for _, c in self.clauses):
            return False
        return all(OPS[op](v, bound) for op, bound in self.clauses)


def satisfies(version: str | Version, spec: str) -> bool:
    """Whether `version` is in the range `spec`."""
    return version in Spec.parse(spec)
