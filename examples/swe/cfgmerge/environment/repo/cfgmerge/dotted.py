"""Dotted paths into nested dictionaries: `db.pool.size`."""

from __future__ import annotations

from typing import Any

_MISSING = object()


def get_path(config: dict[str, Any], path: str, default: Any = _MISSING) -> Any:
    """The value at `path`; `default` when a key on the way is missing (KeyError naming the path without one)."""
    node: Any = config
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            if default is _MISSING:
                raise KeyError(path)
            return default
        node = node[key]
    return node


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    """Set the value at `path`, making the dicts on the way; a non-dict on the way is an error."""
    keys = path.split(".")
    node = config
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise TypeError(f"{path}: {key!r} holds a {type(child).__name__}, not a table")
        node = child
    node[keys[-1]] = value
