"""Protocol codecs, one module per provider protocol. `find_route` asks each in turn which request is its own."""

from __future__ import annotations

from importlib import import_module

# Order matters only where hosts are shared: api.openai.com serves both chat completions and responses.
CODEC_MODULES = ("anthropic", "openai_chat", "openai_responses", "google")

ROUTERS = tuple(import_module(f"{__name__}.{name}") for name in CODEC_MODULES)


def find_route(method: str, host: str, path: str, headers):
    """(codec module, Route) for a provider request, or None when no codec claims it."""
    for codec in ROUTERS:
        route = codec.route(method, host, path, headers)
        if route is not None:
            return codec, route
    return None
