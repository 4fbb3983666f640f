"""Sorting lists of versions and picking the newest one that fits."""

from __future__ import annotations

from collections.abc import Iterable

from verlite.spec import Spec
from verlite.version import Version, parse


def sort_versions(versions: Iterable[str | Version], reverse: bool = False) -> list[Version]:
    """`versions` parsed and sorted oldest first (newest first with `reverse`)."""
    return sorted((parse(v) for v in versions), reverse=reverse)


def latest(versions: Iterable[str | Version], spec: str | None = None, prereleases: bool = False) -> Version | None:
    """The newest of `versions` in `spec` (every version when None), or None."""
    rng = Spec.parse(spec, prereleases) if spec else None
    fits = [v for v in sort_versions(versions)
            if (rng is None and (prereleases or not v.is_prerelease)) or (rng is not None and v in rng)]
    return fits[-1] if fits else None
