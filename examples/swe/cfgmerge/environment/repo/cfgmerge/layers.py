"""Layers: named profiles over shared defaults, with environment overrides on top."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cfgmerge.dotted import set_path
from cfgmerge.merge import deep_merge


def env_overrides(environ: Mapping[str, str], prefix: str = "APP__") -> dict[str, Any]:
    """Overrides from environment variables: `APP__DB__POOL__SIZE=20` sets db.pool.size to 20. Values are read as
    JSON when they parse (numbers, booleans, lists), else kept as strings."""
    out: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(prefix) or name == prefix:
            continue
        path = ".".join(part.lower() for part in name[len(prefix):].split("__"))
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        set_path(out, path, value)
    return out


class Layers:
    """Defaults shared by every profile; `resolve(name)` gives one profile's configuration."""

    def __init__(self, defaults: dict[str, Any], profiles: dict[str, dict[str, Any]] | None = None) -> None:
        self.defaults = defaults
        self.profiles = dict(profiles or {})

    def resolve(self, profile: str | None = None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The defaults, then `profile`'s values (KeyError for an unknown one), then `environ`'s overrides."""
        config = self.defaults
        if profile is not None:
            config = deep_merge(config, self.profiles[profile])
        if environ is not None:
            config = deep_merge(config, env_overrides(environ))
        return config
