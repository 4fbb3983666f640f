"""Contracts every protocol codec fills: the data types that cross the seam, and `Codec`, the seam itself.

A codec is one module per protocol (no mitmproxy import; no module knows two protocols) that satisfies `Codec`:
every member is required, and the driver (`addon/call.py`) uses each directly, never probing for one.

    PROTOCOL: str                                   one of record.PROTOCOLS
    STREAM_CONTENT_TYPE / JSON_CONTENT_TYPE: str    the content types of a streamed and of a JSON answer
    route(method, host, path, headers) -> Route | None
                                                    does this request belong to this protocol, and what is it
    session_key(headers, body) -> SessionKey | None the harness's own session key, if it sends one
    stream_content_type(route) -> str               the streamed answer's content type for this route
    to_chat(body, route) -> ChatPlan                provider request -> OpenAI chat request (raises AgentInputError)
    provider_stop_reason(c: Completion, plan) -> str  what the agent was told (recorded)
    class Encoder(ctx: EncodeContext)               chat stream -> provider stream events (bytes), and the JSON body
        notes: list[str]                            normalizations found while encoding (recorded; often empty)
        start() -> list[bytes]                      called once, when the backend's first chunk arrived
        delta(d: Delta) -> list[bytes]              one parsed backend chunk
        finish(c: Completion) -> list[bytes]        closing events (the gateway writes the record before sending them)
        error(e: GatewayError) -> list[bytes]       a mid-stream failure, in the protocol's own error event
        response(c: Completion) -> dict             the whole non-streaming response body
    error_response(e: GatewayError) -> (status, body bytes)
                                                    a failure before response headers, in the provider's shape
    count_tokens_response(n: int, route) -> dict    answer to the protocol's token-count endpoint

Every codec module lays these out in the same sections, in this order: constants · route and session key ·
request (to_chat) · response (provider_stop_reason, Encoder: streaming, then non-streaming) · errors and token
counts. The wire mechanics they share (header lookup, host names, number checks, notes, SSE framing, the OpenAI
error table) are in `wire.py`.

The gateway owns everything between: upstream shaping, the backend call, timeouts, records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from polar.records import is_constrained

RouteKind = Literal["generate", "count_tokens", "websocket", "not_found"]


@dataclass(frozen=True)
class Route:
    """What a provider request is, decided from method, host and path alone."""

    protocol: str
    kind: RouteKind
    stream: bool | None = None  # known from the URL (Google); None = decided by the body
    model: str | None = None  # from the URL (Google)
    sse: bool = True  # Google without alt=sse streams a JSON array instead


@dataclass(frozen=True)
class SessionKey:
    source: str  # "harness:<key>"
    value: str


@dataclass(frozen=True)
class ChatPlan:
    """A provider request translated to OpenAI chat. `chat` holds only what the agent asked for (messages, tools,
    tool_choice, its sampling values, stop, response_format, max_tokens); the gateway adds model, stream, token-id
    and logprob fields, explicit sampling defaults and the max_tokens clamp."""

    chat: dict
    stream: bool  # what the agent asked
    model_requested: str | None
    normalizations: tuple[str, ...] = ()
    agent_top_logprobs: int | None = None  # the agent asked for logprobs itself (OpenAI chat); None = it did not
    extra: dict = field(default_factory=dict)  # codec-private facts the Encoder needs (e.g. custom tool names)

    @property
    def constrained(self) -> bool:
        """tool_choice required/named or a JSON-schema response format: the record's one rule, on this plan."""
        return is_constrained(self.chat)


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class Delta:
    """The meaning of one backend chunk, protocol-free."""

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    finish_reason: str | None = None
    logprobs: tuple[dict, ...] = ()  # OpenAI logprobs.content entries (only used for an agent that asked)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text as the model produced it


@dataclass(frozen=True)
class Completion:
    """Everything the backend said about one generation, assembled from its stream."""

    content: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None  # backend value: stop|length|tool_calls|abort|error
    stop_reason: str | int | None  # matched stop string / token id, None on EOS or length
    prompt_tokens: int
    completion_tokens: int
    logprobs: tuple[dict, ...] = ()  # OpenAI logprobs.content entries, only kept when the agent asked


@dataclass(frozen=True)
class EncodeContext:
    """What an Encoder may know about the call it answers."""

    plan: ChatPlan
    route: Route
    response_id: str  # stable id for this call (derived from the record id)
    model: str  # the model name shown to the agent (what it requested)
    prompt_tokens: int | None = None  # from the backend's first chunk; None if the backend gives it only at the end
    created: int = 0  # epoch seconds


ErrorKind = Literal["bad_request", "context_overflow", "too_large", "rate_limited", "unavailable", "not_found",
                    "websocket", "forbidden"]


@dataclass(eq=False)
class GatewayError(Exception):
    """A failure to report to the agent in its provider's shape (the error table in docs/architecture.md)."""

    kind: ErrorKind
    message: str
    status: int | None = None  # override (e.g. a backend 400 passed on as the provider's 400)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class AgentInputError(GatewayError):
    """The agent's request cannot be translated: the provider's 400."""

    def __init__(self, message: str):
        super().__init__("bad_request", message)


# ---------------------------------------------------------------------------------------------------------------
# the seam: what every codec module provides
# ---------------------------------------------------------------------------------------------------------------


@runtime_checkable
class ResponseEncoder(Protocol):
    """What a codec's `Encoder(ctx)` builds for one call: the agent's stream events, or its whole JSON body."""

    notes: list[str]  # normalizations found while encoding (e.g. invalid tool arguments kept raw), for the record

    def start(self) -> list[bytes]: ...

    def delta(self, d: Delta) -> list[bytes]: ...

    def finish(self, c: Completion) -> list[bytes]: ...

    def error(self, e: GatewayError) -> list[bytes]: ...

    def response(self, c: Completion) -> dict: ...


@runtime_checkable
class Codec(Protocol):
    """One provider protocol, as a module (PEP 544: a module satisfies a protocol with its globals). Every member
    is required; the module docstring above says what each one answers."""

    PROTOCOL: str
    STREAM_CONTENT_TYPE: str
    JSON_CONTENT_TYPE: str
    Encoder: Callable[[EncodeContext], ResponseEncoder]

    def route(self, method: str, host: str, path: str, headers: Any = None) -> Route | None: ...

    def session_key(self, headers: Any, body: dict | None) -> SessionKey | None: ...

    def stream_content_type(self, route: Route) -> str: ...

    def to_chat(self, body: Any, route: Route) -> ChatPlan: ...

    def provider_stop_reason(self, c: Completion, plan: ChatPlan | None = None) -> str: ...

    def error_response(self, e: GatewayError) -> tuple[int, bytes]: ...

    def count_tokens_response(self, n: int, route: Route) -> dict: ...
