"""Deep merge of nested dictionaries."""

from __future__ import annotations

from typing import Any

DELETE = object()  # an override value that removes the key


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`base` with `override` on top: nested dicts are merged key by key, any other value (lists included) replaces
    the base's, and DELETE removes the key. Returns the merged dict."""
    merged = base
    for key, value in override.items():
        if value is DELETE:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
