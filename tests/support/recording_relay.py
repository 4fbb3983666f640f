"""A recording HTTP relay between the gateway and a backend: proxy → relay → vLLM (or SGLang, or a stand-in).

It forwards every request and response unchanged — same method, path, headers, body bytes, status — and streams the
response through as it arrives (one upstream read → one downstream chunk), so it never changes what the gateway sees.
For each request it keeps the request body and the raw response bytes; `Exchange.chunks` parses a chat stream's SSE
events and `Exchange.truth()` derives what the backend actually sent (prompt ids, completion ids, logprobs, usage,
finish reason) in vLLM's format or SGLang's. That is the ground truth a contract test compares a record against::

    relay = RecordingRelay("http://127.0.0.1:8000")   # the backend root (no /v1)
    relay.start()                                       # relay.base_url → "http://127.0.0.1:<port>/v1"
    ...
    relay.chats()[-1].truth().completion_ids
"""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.support.servers import LoopbackHTTPServer, read_request_body

# Hop-by-hop headers are the relay's own business on each side (RFC 9110 §7.6.1); everything else passes as is.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class Truth:
    """What the backend sent for one chat call (None where it sent nothing)."""

    prompt_token_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    usage: dict | None = None
    finish_reason: str | None = None
    stop_reason: Any = None
    system_fingerprint: str | None = None
    weight_versions: Any = None
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # [{"id", "name", "arguments"}], arguments as sent


@dataclass
class Exchange:
    """One request through the relay and the backend's answer, byte for byte."""

    method: str
    path: str
    request_headers: dict[str, str]
    request_body: bytes
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b""
    complete: bool = False  # the backend's response ended normally
    finished: threading.Event = field(default_factory=threading.Event, repr=False)  # the relay is done with it

    def wait(self, timeout: float = 10.0) -> "Exchange":
        """Block until the relay has finished this exchange (its last bytes may reach the client first)."""
        if not self.finished.wait(timeout):
            raise TimeoutError(f"relay exchange {self.method} {self.path} still open after {timeout}s")
        return self

    def json(self) -> Any:
        return json.loads(self.request_body) if self.request_body else None

    def response_json(self) -> Any:
        return json.loads(self.response_body)

    @property
    def streamed(self) -> bool:
        return self.response_headers.get("content-type", "").startswith("text/event-stream")

    @property
    def chunks(self) -> list[dict]:
        """The parsed `data:` events of an SSE response, without `[DONE]`."""
        out = []
        for line in self.response_body.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload != b"[DONE]":
                    out.append(json.loads(payload))
        return out

    def truth(self) -> Truth:
        """Token data as the backend sent it: vLLM (first-chunk `prompt_token_ids`, per-chunk `token_ids`),
        SGLang (trailing `sglext` chunk; per-choice ids when not streaming) or a plain JSON response."""
        t = Truth()
        docs = self.chunks if self.streamed else [self.response_json()]
        for doc in docs:
            if doc.get("system_fingerprint"):
                t.system_fingerprint = doc["system_fingerprint"]
            if doc.get("usage"):
                t.usage = doc["usage"]
            if doc.get("prompt_token_ids") is not None and t.prompt_token_ids is None:
                t.prompt_token_ids = list(doc["prompt_token_ids"])
            ext = doc.get("sglext")
            if isinstance(ext, dict):
                if ext.get("input_ids") is not None:
                    t.prompt_token_ids = list(ext["input_ids"])
                if ext.get("output_ids") is not None:  # one list per choice (SGLang 0.5.23's SglExt.output_ids)
                    per_choice = ext["output_ids"]
                    assert all(isinstance(x, list) for x in per_choice), f"output_ids is per choice: {per_choice}"
                    t.completion_ids = list(per_choice[0])
            for choice in doc.get("choices") or []:
                if choice.get("prompt_token_ids") is not None and t.prompt_token_ids is None:
                    t.prompt_token_ids = list(choice["prompt_token_ids"])
                for key in ("token_ids", "response_token_ids"):
                    if choice.get(key) is not None:
                        t.completion_ids = (t.completion_ids or []) + list(choice[key])
                for entry in ((choice.get("logprobs") or {}).get("content") or []):
                    t.logprobs = (t.logprobs or []) + [float(entry["logprob"])]
                if choice.get("finish_reason"):
                    t.finish_reason = choice["finish_reason"]
                    t.stop_reason = choice.get("stop_reason")
                if choice.get("weight_versions") is not None:
                    t.weight_versions = choice["weight_versions"]
                part = choice.get("delta") or choice.get("message") or {}
                t.content += part.get("content") or ""
                t.reasoning += part.get("reasoning") or part.get("reasoning_content") or ""
                for i, tc in enumerate(part.get("tool_calls") or []):
                    index = tc.get("index", i)
                    while len(t.tool_calls) <= index:
                        t.tool_calls.append({"id": None, "name": None, "arguments": ""})
                    slot, fn = t.tool_calls[index], tc.get("function") or {}
                    slot["id"] = slot["id"] or tc.get("id")
                    slot["name"] = slot["name"] or fn.get("name")
                    slot["arguments"] += fn.get("arguments") or ""
        return t


class RecordingRelay(LoopbackHTTPServer):
    """A threaded relay on 127.0.0.1 in front of `target` (the backend's root URL, with or without /v1)."""

    def __init__(self, target: str, host: str = "127.0.0.1", port: int = 0, timeout: float = 600.0):
        target = target.rstrip("/")
        if target.endswith("/v1"):
            target = target[:-3]
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the relay forwards plain http only: {target}")
        self.target = target
        self._upstream = (parts.hostname, parts.port or 80)
        self._host, self._port = host, port
        self.timeout = timeout
        self._lock = threading.Lock()
        self.exchanges: list[Exchange] = []
        self._server: ThreadingHTTPServer | None = None

    # ---- lifecycle
    def start(self) -> str:
        if self._server is None:
            self._serve(ThreadingHTTPServer, type("Handler", (_Handler,), {"relay": self}), "recording-relay")
        return self.base_url

    def stop(self) -> None:
        self._shutdown()

    # ---- what went through
    def _add(self, ex: Exchange) -> None:
        with self._lock:
            self.exchanges.append(ex)

    def mark(self) -> int:
        """The number of exchanges so far (pass to `chats(since=...)`)."""
        with self._lock:
            return len(self.exchanges)

    def chats(self, since: int = 0) -> list[Exchange]:
        """Chat-completion exchanges, in arrival order, from index `since` on."""
        with self._lock:
            found = [e for e in self.exchanges[since:] if e.path.split("?")[0].endswith("/chat/completions")]
        return [e.wait() for e in found]

    def clear(self) -> None:
        with self._lock:
            self.exchanges.clear()


class _Handler(BaseHTTPRequestHandler):
    relay: RecordingRelay
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _read_body(self) -> bytes:
        return read_request_body(self)

    def _relay(self) -> None:
        relay = self.relay
        body = self._read_body()
        # The body is re-framed with its own Content-Length: drop the sender's (any spelling) so it is never doubled.
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"}
        ex = Exchange(self.command, self.path, {k.lower(): v for k, v in headers.items()}, body)
        relay._add(ex)
        try:
            self._forward(ex, headers, body)
        finally:
            ex.finished.set()

    def _forward(self, ex: Exchange, headers: dict, body: bytes) -> None:
        relay = self.relay
        conn = http.client.HTTPConnection(*relay._upstream, timeout=relay.timeout)
        try:
            if body or self.command in ("POST", "PUT", "PATCH"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
        except OSError as exc:
            conn.close()
            ex.status = 502
            msg = json.dumps({"error": {"message": f"relay: backend unreachable: {exc!r}"}}).encode()
            self.send_response(502)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        ex.status = resp.status
        ex.response_headers = {k.lower(): v for k, v in resp.getheaders()}
        length = resp.getheader("content-length")
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP and k.lower() not in ("content-length", "date", "server"):
                self.send_header(k, v)
        chunked = length is None
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("content-length", length)
        self.end_headers()
        try:
            while True:
                data = resp.read1(65536)
                if not data:
                    break
                # Kept before it is forwarded: whatever the client has seen is already in the log.
                ex.response_body += data
                # One upstream read → one downstream write: the relay adds no buffering of its own.
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                self.wfile.flush()
            ex.complete = True
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except (OSError, http.client.HTTPException):
            # The backend dropped the stream: drop ours the same way so the gateway sees the same failure.
            self.close_connection = True
        finally:
            conn.close()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay
