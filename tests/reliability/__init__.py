"""Reliability and security tests (issue 8), and the protocol table they share with scripts/soak.

`PROTOCOLS` describes each provider protocol the way an agent sees it on the wire: where a generation request goes,
a minimal body, the error table in docs/architecture.md (status and the provider's error label per gateway error kind),
and how to read a streamed answer's ending (a clean end, the protocol's mid-stream error event, or neither).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Protocol:
    name: str  # the record's `protocol`
    url: Callable[[bool], str]  # stream? → URL
    body: Callable[[bool, str], dict]  # (stream, user text) → a minimal valid request body
    errors: dict  # gateway error kind → (status, label)
    label: Callable[[dict], str]  # an error body → its label (error type / status)

    def error_ok(self, status: int, raw: bytes) -> bool:
        """True when (status, body) is this provider's error shape."""
        try:
            doc = json.loads(raw)
        except ValueError:
            return False
        if not isinstance(doc, dict) or not isinstance(doc.get("error"), dict):
            return False
        if self.name == "anthropic_messages" and doc.get("type") != "error":
            return False
        if not isinstance(doc["error"].get("message"), str):
            return False
        return any(status == s and self.label(doc) == lab for s, lab in self.errors.values()) or (
            status in (404, 426) and bool(self.label(doc)))


def sse_events(raw: bytes) -> list[tuple[str | None, object]]:
    """(event name, parsed data) for every SSE event; data that is not JSON stays bytes."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data.append(line[5:].strip())
        payload = b"\n".join(data)
        try:
            out.append((name, json.loads(payload)))
        except ValueError:
            out.append((name, payload))
    return out


def stream_ending(proto: Protocol, raw: bytes) -> str:
    """'ok' (the protocol's clean end), 'error' (its mid-stream error event, last) or 'incomplete'."""
    events = sse_events(raw)
    if not events:
        return "incomplete"
    name, data = events[-1]
    if proto.name == "anthropic_messages":
        if name == "message_stop":
            return "ok"
        if name == "error" and data["error"]["type"] == "overloaded_error":
            return "error"
    elif proto.name == "openai_chat":
        if data == b"[DONE]":
            return "ok"
        if isinstance(data, dict) and "error" in data and all(d != b"[DONE]" for _, d in events):
            return "error"
    elif proto.name == "openai_responses":
        if name in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens reached
            return "ok"
        if name == "response.failed" and data["response"]["status"] == "failed":
            return "error"
    elif proto.name == "google_generate":
        if isinstance(data, dict) and "error" in data:
            return "error" if data["error"].get("status") == "UNAVAILABLE" else "incomplete"
        if isinstance(data, dict) and (data.get("candidates") or [{}])[0].get("finishReason"):
            return "ok"
    return "incomplete"


def json_ok(proto: Protocol, raw: bytes) -> bool:
    """A whole successful (non-streamed) answer of this protocol."""
    doc = json.loads(raw)
    if proto.name == "anthropic_messages":
        return doc.get("type") == "message" and doc.get("stop_reason") is not None
    if proto.name == "openai_chat":
        return doc.get("object") == "chat.completion" and doc["choices"][0]["finish_reason"] is not None
    if proto.name == "openai_responses":
        return doc.get("object") == "response" and doc.get("status") in ("completed", "incomplete")
    return bool(doc["candidates"][0].get("finishReason"))


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


ANTHROPIC = Protocol(
    "anthropic_messages",
    lambda stream: "https://api.anthropic.com/v1/messages",
    lambda stream, text: {"model": "claude-test", "max_tokens": 64, "messages": _user(text), "stream": stream},
    {"unavailable": (529, "overloaded_error"), "rate_limited": (429, "rate_limit_error"),
     "bad_request": (400, "invalid_request_error"), "too_large": (413, "request_too_large")},
    lambda doc: doc["error"].get("type"),
)
OPENAI_CHAT = Protocol(
    "openai_chat",
    lambda stream: "https://api.openai.com/v1/chat/completions",
    lambda stream, text: {"model": "gpt-test", "messages": _user(text), "stream": stream},
    {"unavailable": (503, "server_error"), "rate_limited": (429, "requests"),
     "bad_request": (400, "invalid_request_error"), "too_large": (413, "invalid_request_error")},
    lambda doc: doc["error"].get("type"),
)
OPENAI_RESPONSES = Protocol(
    "openai_responses",
    lambda stream: "https://api.openai.com/v1/responses",
    lambda stream, text: {"model": "gpt-test", "input": text, "stream": stream},
    OPENAI_CHAT.errors,
    lambda doc: doc["error"].get("type"),
)
GOOGLE = Protocol(
    "google_generate",
    lambda stream: ("https://generativelanguage.googleapis.com/v1beta/models/gemini-test:"
                    + ("streamGenerateContent?alt=sse" if stream else "generateContent")),
    lambda stream, text: {"contents": [{"role": "user", "parts": [{"text": text}]}]},
    {"unavailable": (503, "UNAVAILABLE"), "rate_limited": (429, "RESOURCE_EXHAUSTED"),
     "bad_request": (400, "INVALID_ARGUMENT"), "too_large": (400, "INVALID_ARGUMENT")},
    lambda doc: doc["error"].get("status"),
)

PROTOCOLS = (ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, GOOGLE)
BY_NAME = {p.name: p for p in PROTOCOLS}
