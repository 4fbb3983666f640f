"""verlite: version numbers `MAJOR.MINOR.PATCH[-PRE]`, compared, matched against ranges and sorted."""

from verlite.ordering import latest, sort_versions
from verlite.spec import Spec, satisfies
from verlite.version import Version, VersionError, parse

__all__ = ["Spec", "Version", "VersionError", "latest", "parse", "satisfies", "sort_versions"]
__version__ = "0.6.0"
