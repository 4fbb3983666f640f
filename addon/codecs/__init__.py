"""Protocol codecs, one module per provider protocol, each filling the seam `base.Codec` (helpers they share:
`wire`). `find_route` asks each in turn which request is its own. A fifth protocol is one more module here, named
in CODEC_MODULES (and its protocol in record.PROTOCOLS); tests/addon/codecs/test_contract.py checks it fits."""

from __future__ import annotations

from importlib import import_module
from typing import Any, cast

from .base import Codec, Route

# Order matters only where hosts are shared: api.openai.com serves both chat completions and responses.
CODEC_MODULES = ("anthropic", "openai_chat", "openai_responses", "google")

ROUTERS: tuple[Codec, ...] = tuple(cast(Codec, import_module(f"{__name__}.{name}")) for name in CODEC_MODULES)


def find_route(method: str, host: str, path: str, headers: Any) -> tuple[Codec, Route] | None:
    """(codec module, Route) for a provider request, or None when no codec claims it."""
    for codec in ROUTERS:
        route = codec.route(method, host, path, headers)
        if route is not None:
            return codec, route
    return None
