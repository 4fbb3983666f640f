"""Wire mechanics every codec repeats, written once. No protocol's rules live here (those stay in the codec that owns
them), and nothing here imports mitmproxy.

- `header(headers, name)`: one request header, case-insensitive, from a mapping or (name, value) pairs
- `host_name(host)`: the bare, lower-case host name every `route` compares (addon/hosts.py's rule)
- `is_number`, `is_int`, `number_between`: JSON number checks
- `Notes`: the ordered, de-duplicated normalizations a codec records
- `sse(event, data)`: one server-sent event
- `OPENAI_ERRORS`, `openai_error(e, overflow_param)`: the error table and error object OpenAI Chat and Responses share
"""

from __future__ import annotations

import math
from typing import Any

from polar.addon.codecs.base import AgentInputError, GatewayError
from polar.addon.hosts import host_name
from polar.addon.provider_errors import OPENAI_ERRORS

__all__ = ["OPENAI_ERRORS", "Notes", "header", "host_name", "is_int", "is_number", "number_between", "openai_error",
           "sse"]


# ---------------------------------------------------------------------------------------------------------------
# request headers and hosts
# ---------------------------------------------------------------------------------------------------------------


def header(headers: Any, name: str) -> str | None:
    """A header value from a mapping (dict, mitmproxy Headers) or a sequence of (name, value) pairs, names compared
    case-insensitively; bytes are read as latin-1. None when absent."""
    if not headers:
        return None
    name = name.lower()
    pairs = headers.items() if hasattr(headers, "items") else headers
    for key, value in pairs:
        if isinstance(key, bytes):
            key = key.decode("latin-1")
        if key.lower() == name:
            if value is None:
                return None
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None


# ---------------------------------------------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------------------------------------------


def is_number(v: Any) -> bool:
    """A JSON number (bool excluded, finite)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_int(v: Any) -> bool:
    """A JSON integer (bool excluded)."""
    return isinstance(v, int) and not isinstance(v, bool)


def number_between(body: dict, key: str, lo: float, hi: float) -> int | float | None:
    """`body[key]` when it is a number in [lo, hi]; None when absent or null; else the provider's 400."""
    value = body.get(key)
    if value is None:
        return None
    if not is_number(value) or not lo <= value <= hi:
        raise AgentInputError(f"'{key}' must be a number between {lo} and {hi}")
    return value


# ---------------------------------------------------------------------------------------------------------------
# normalization notes
# ---------------------------------------------------------------------------------------------------------------


class Notes:
    """Ordered, de-duplicated normalization strings (what a codec changed in the agent's request)."""

    def __init__(self) -> None:
        self._items: dict[str, None] = {}

    def add(self, note: str) -> None:
        self._items.setdefault(note, None)

    @property
    def items(self) -> tuple[str, ...]:
        return tuple(self._items)


# ---------------------------------------------------------------------------------------------------------------
# framing and errors
# ---------------------------------------------------------------------------------------------------------------


def sse(event: str | None, data: bytes | str) -> bytes:
    """One server-sent event (`data:` only when `event` is None)."""
    if isinstance(data, str):
        data = data.encode()
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + data + b"\n\n"


def openai_error(e: GatewayError, overflow_param: str) -> tuple[int, dict]:
    """(status, error object) in OpenAI's shape; a context overflow names `overflow_param` (the field holding the
    prompt: `messages` for Chat, `input` for Responses). An explicit status (a backend 4xx passed on) wins."""
    status, kind, code = OPENAI_ERRORS.get(e.kind, OPENAI_ERRORS["unavailable"])
    param = overflow_param if e.kind == "context_overflow" else None
    return e.status or status, {"message": e.message, "type": kind, "param": param, "code": code}
