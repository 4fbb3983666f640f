"""Each provider protocol's error table and error body, written once. Standard library only: the codecs use these
tables, and the fail-closed path in polar_addon.py loads this file by path (it runs exactly when the package is
broken) to answer each provider in its own shape.

Kinds are those of `codecs.base.ErrorKind`; the error table in docs/architecture.md gives the statuses.
"""

from __future__ import annotations

import json

# OpenAI (Chat Completions and Responses share it): kind → (status, type, code).
OPENAI_ERRORS: dict[str, tuple[int, str, str | None]] = {
    "rate_limited": (429, "requests", "rate_limit_exceeded"),
    "unavailable": (503, "server_error", "service_unavailable"),
    "context_overflow": (400, "invalid_request_error", "context_length_exceeded"),
    "too_large": (413, "invalid_request_error", "request_too_large"),
    "bad_request": (400, "invalid_request_error", None),
    "not_found": (404, "invalid_request_error", "not_found"),
    "websocket": (426, "invalid_request_error", "upgrade_required"),
    "forbidden": (403, "invalid_request_error", "forbidden"),
}

# Anthropic: kind → (status, error type); a backend 4xx passed on keeps its status and takes the type by status.
ANTHROPIC_ERRORS: dict[str, tuple[int, str]] = {
    "bad_request": (400, "invalid_request_error"),
    "context_overflow": (400, "invalid_request_error"),
    "too_large": (413, "request_too_large"),
    "rate_limited": (429, "rate_limit_error"),
    "unavailable": (529, "overloaded_error"),
    "not_found": (404, "not_found_error"),
    "websocket": (426, "invalid_request_error"),
    "forbidden": (403, "permission_error"),
}
ANTHROPIC_STATUS_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error",
}

# Google: kind → (code, status); an explicit HTTP status maps to its canonical status name.
GOOGLE_ERRORS: dict[str, tuple[int, str]] = {
    "rate_limited": (429, "RESOURCE_EXHAUSTED"), "unavailable": (503, "UNAVAILABLE"),
    "context_overflow": (400, "INVALID_ARGUMENT"), "too_large": (400, "INVALID_ARGUMENT"),
    "bad_request": (400, "INVALID_ARGUMENT"), "not_found": (404, "NOT_FOUND"),
    "websocket": (400, "FAILED_PRECONDITION"), "forbidden": (403, "PERMISSION_DENIED"),
}
GOOGLE_STATUS_NAMES: dict[int, str] = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ABORTED",
    413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED",
    503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}

JSON_CONTENT_TYPES = {"anthropic_messages": "application/json", "openai_chat": "application/json",
                      "openai_responses": "application/json", "google_generate": "application/json; charset=UTF-8"}


def unavailable(protocol: str | None, message: str) -> tuple[int, str, bytes]:
    """(status, content type, body): the provider's "service unavailable" error, exactly as the protocol's codec
    answers a backend that is down. A host no codec serves (protocol None) gets OpenAI's shape, the most common one."""
    return error_answer(protocol, "unavailable", message)


def error_answer(protocol: str | None, kind: str, message: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of one error kind in the protocol's shape (OpenAI's when protocol is None), as
    its codec writes it."""
    if protocol == "anthropic_messages":
        status, type_ = ANTHROPIC_ERRORS[kind]
        body = {"type": "error", "error": {"type": type_, "message": message}}
    elif protocol == "google_generate":
        status, name = GOOGLE_ERRORS[kind]
        body = {"error": {"code": status, "message": message, "status": name}}
    else:
        status, type_, code = OPENAI_ERRORS[kind]
        body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    content_type = JSON_CONTENT_TYPES.get(protocol or "", "application/json")
    return status, content_type, json.dumps(body, separators=(",", ":")).encode()
