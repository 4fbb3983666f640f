"""Upstream shaping and the backend stream reader — the one place that knows the backend's wire format.

Shaping turns a codec's ChatPlan into the exact OpenAI chat body sent to vLLM or SGLang (DESIGN §4 "Upstream
request"): always streamed with usage, token ids and logprobs on, sampling explicit, max_tokens clamped. The reader
turns the backend's SSE chunks into protocol-free Deltas and accumulates the Completion plus the token data the record
keeps. An exact on-policy mode can replace the prompt here later without touching any codec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson

from .codecs.base import Completion, Delta, GatewayError, ToolCall, ToolCallDelta

# Explicit defaults: vLLM would otherwise apply the model's generation_config (FIELD-NOTES §1).
DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


@dataclass(frozen=True)
class BackendInfo:
    kind: str  # "vllm" | "sglang"
    version: str | None
    model: str
    max_model_len: int | None

    def at_least(self, version: str) -> bool:
        def parts(v: str) -> tuple[int, ...]:
            return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

        return bool(self.version) and parts(self.version) >= parts(version)


def prompt_size_bound(chat: dict) -> int:
    """A cheap upper bound of the prompt's token count: every token is at least one byte of rendered text, and the
    template adds a bounded amount per message. Used to skip /tokenize when max_tokens cannot overflow."""
    messages = chat.get("messages") or []
    return len(orjson.dumps(messages)) + len(orjson.dumps(chat.get("tools") or [])) + 32 * len(messages) + 512


@dataclass
class Shaped:
    body: dict
    sampling: dict
    normalizations: list[str]
    headers: dict = field(default_factory=dict)


def shape(plan_chat: dict, *, backend: BackendInfo, agent_top_logprobs: int | None, logprobs_mode: str,
          sampling_override: dict, thinking: bool | None, thinking_kwarg: str | None,
          prompt_len: int | None) -> Shaped:
    """The exact upstream body for one call. `prompt_len` is the tokenized prompt length when it was needed for the
    max_tokens clamp (else None)."""
    notes: list[str] = []
    body = dict(plan_chat)
    body["model"] = backend.model
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    tools = body.get("tools")
    if not tools:
        # vLLM rejects `tools: []`, and tool_choice without tools.
        body.pop("tools", None)
        if body.pop("tool_choice", None) not in (None, "none", "auto"):
            notes.append("tool_choice_without_tools_dropped")
    for name, default in DEFAULT_SAMPLING.items():
        if body.get(name) is None:
            body[name] = default
    for name, value in sampling_override.items():
        if body.get(name) != value:
            notes.append(f"sampling_override:{name}={value}")
        body[name] = value
    requested = body.get("max_tokens")
    if requested is not None and backend.max_model_len and prompt_len is not None:
        room = backend.max_model_len - prompt_len
        if requested > room:
            body["max_tokens"] = room
            notes.append(f"max_tokens_clamped:{requested}->{room}")
    if thinking is not None and thinking_kwarg:
        kwargs = dict(body.get("chat_template_kwargs") or {})
        kwargs[thinking_kwarg] = bool(thinking)
        body["chat_template_kwargs"] = kwargs
        notes.append(f"thinking_kwarg:{thinking_kwarg}={bool(thinking)}")
    headers: dict = {}
    body["logprobs"] = True
    body["top_logprobs"] = agent_top_logprobs or 0
    if backend.kind == "sglang":
        # SGLang streams ids only through its extension headers (FIELD-NOTES §1).
        headers = {"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"}
    else:
        body["return_token_ids"] = True
        if backend.at_least("0.33"):
            body["return_weight_versions"] = True
    sampling = {k: body.get(k) for k in ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "min_p",
                                          "repetition_penalty", "top_logprobs") if body.get(k) is not None}
    sampling["max_tokens_requested"] = requested
    sampling["logprobs_mode"] = logprobs_mode
    if sampling_override:
        sampling["override"] = dict(sampling_override)
    return Shaped(body, sampling, notes, headers)


class StreamReader:
    """Accumulates one backend SSE stream. feed(bytes) → the Deltas it completed; the first chunk's prompt ids are
    in .prompt_token_ids as soon as it is read.

    A forced tool call (tool_choice required or named) is guided JSON: `[{"name", "parameters"}]` for required, the
    arguments object for named. Some backend configurations stream that JSON as plain content (vLLM with a reasoning
    parser runs the tool parser only after reasoning ended), so for a forced call the content is held back; if no
    tool-call delta came, the held JSON becomes the tool calls at the finish chunk, else it is released as text."""

    def __init__(self, keep_logprob_entries: bool, forced_tool_choice=None, call_id_prefix: str = "call"):
        self.keep_logprob_entries = keep_logprob_entries
        self.forced = forced_tool_choice if (forced_tool_choice == "required"
                                             or isinstance(forced_tool_choice, dict)) else None
        self.call_id_prefix = call_id_prefix
        self.held: list[str] = []
        self.forced_from_content = False
        self._buf = b""
        self.done = False  # saw [DONE]
        self.chunks = 0
        self.prompt_token_ids: list[int] | None = None
        self.completion_token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.logprob_entries: list[dict] = []
        self.missing_logprobs = False
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.stop_reason = None
        self.usage: dict | None = None
        self.system_fingerprint: str | None = None
        self.model: str | None = None
        self.weight_versions = None

    def feed(self, data: bytes) -> list[Delta]:
        """Parse whole SSE events out of `data`; raise GatewayError on an error event or garbage."""
        if b"\n" not in data:
            self._buf += data
            return []
        # One split per read (not one copy of the rest of the buffer per line): a read may hold a whole stream.
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        out: list[Delta] = []
        for line in lines:
            line = line.rstrip(b"\r")
            if not line or line.startswith(b":") or line.startswith(b"event:"):
                continue
            if not line.startswith(b"data:"):
                raise GatewayError("unavailable", f"backend sent a line that is not SSE: {line[:200]!r}")
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise GatewayError("unavailable", f"backend sent malformed JSON in its stream: {payload[:200]!r}")
            delta = self._chunk(chunk)
            if delta is not None:
                out.append(delta)
        return out

    def _chunk(self, chunk: dict) -> Delta | None:
        if not isinstance(chunk, dict):
            raise GatewayError("unavailable", "backend stream chunk is not an object")
        if "error" in chunk and not chunk.get("choices"):
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            raise GatewayError("unavailable", f"backend stream error: {err.get('message', err)}")
        self.chunks += 1
        if chunk.get("prompt_token_ids") is not None and self.prompt_token_ids is None:
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        if chunk.get("system_fingerprint"):
            self.system_fingerprint = chunk["system_fingerprint"]
        if chunk.get("model"):
            self.model = chunk["model"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        ext = chunk.get("sglext")
        if isinstance(ext, dict):
            if ext.get("input_ids") is not None:
                self.prompt_token_ids = list(ext["input_ids"])
            if ext.get("output_ids") is not None:
                self.completion_token_ids = list(ext["output_ids"])
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        if choice.get("prompt_token_ids") is not None and self.prompt_token_ids is None:
            self.prompt_token_ids = list(choice["prompt_token_ids"])
        ids = choice.get("token_ids")
        if ids is not None:
            if self.completion_token_ids is None:
                self.completion_token_ids = []
            self.completion_token_ids.extend(ids)
        lp = choice.get("logprobs")
        entries = (lp or {}).get("content") or []
        if entries:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(float(e.get("logprob", 0.0)) for e in entries)
            if self.keep_logprob_entries:
                self.logprob_entries.extend(entries)
        elif ids:
            self.missing_logprobs = True
        if choice.get("weight_versions") is not None:
            self.weight_versions = choice["weight_versions"]
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
        calls = []
        for tc in delta.get("tool_calls") or []:
            index = int(tc.get("index", 0))
            fn = tc.get("function") or {}
            slot = self.tool_calls.setdefault(index, {"id": None, "name": None, "arguments": []})
            if tc.get("id") and not slot["id"]:
                slot["id"] = tc["id"]
            if fn.get("name") and not slot["name"]:
                slot["name"] = fn["name"]
            args = fn.get("arguments") or ""
            slot["arguments"].append(args)
            calls.append(ToolCallDelta(index, tc.get("id"), fn.get("name"), args))
        finish = choice.get("finish_reason")
        if self.forced is not None and not self.tool_calls and not calls:
            if text:
                self.held.append(text)
                text = ""
            if finish:
                text, calls = self._release_forced()
        elif self.held:
            text = "".join(self.held) + text
            self.held = []
        if text:
            self.content.append(text)
        if reasoning:
            self.reasoning.append(reasoning)
        if finish:
            self.finish_reason = finish
            self.stop_reason = choice.get("stop_reason")
            if self.stop_reason is None and isinstance(choice.get("matched_stop"), str):
                # SGLang names a matched stop string in `matched_stop` (an int there is EOS or a stop id: not kept,
                # so a null stop_reason still means EOS as with vLLM).
                self.stop_reason = choice["matched_stop"]
        if not (text or reasoning or calls or finish or entries):
            return None
        return Delta(text=text, reasoning=reasoning, tool_calls=tuple(calls), finish_reason=finish,
                     logprobs=tuple(entries) if self.keep_logprob_entries else ())

    def _release_forced(self) -> tuple[str, list[ToolCallDelta]]:
        """At the finish chunk of a forced call that produced no tool-call deltas: parse the held guided JSON."""
        held, self.held = "".join(self.held), []
        try:
            parsed = orjson.loads(held) if held.strip() else None
        except orjson.JSONDecodeError:
            return held, []
        if self.forced == "required" and isinstance(parsed, list) and parsed and all(
                isinstance(c, dict) and isinstance(c.get("name"), str) for c in parsed):
            pairs = [(c["name"], c.get("parameters", c.get("arguments", {}))) for c in parsed]
        elif isinstance(self.forced, dict) and isinstance(parsed, dict):
            pairs = [(((self.forced.get("function") or {}).get("name")) or "", parsed)]
        else:
            return held, []
        calls = []
        for index, (name, args) in enumerate(pairs):
            arguments = args if isinstance(args, str) else orjson.dumps(args).decode()
            call_id = f"{self.call_id_prefix}_{index}"
            self.tool_calls[index] = {"id": call_id, "name": name, "arguments": [arguments]}
            calls.append(ToolCallDelta(index, call_id, name, arguments))
        self.forced_from_content = True
        return "", calls

    def completion(self) -> Completion:
        calls = tuple(
            ToolCall(slot["id"] or f"call_{i}", slot["name"] or "", "".join(slot["arguments"]))
            for i, slot in sorted(self.tool_calls.items())
        )
        usage = self.usage or {}
        prompt = usage.get("prompt_tokens")
        if prompt is None:
            prompt = len(self.prompt_token_ids or ())
        completion_n = usage.get("completion_tokens")
        if completion_n is None:
            completion_n = len(self.completion_token_ids or ())
        return Completion(
            content="".join(self.content), reasoning="".join(self.reasoning), tool_calls=calls,
            finish_reason=self.finish_reason, stop_reason=self.stop_reason, prompt_tokens=int(prompt),
            completion_tokens=int(completion_n), logprobs=tuple(self.logprob_entries),
        )

    def assistant_message(self) -> dict:
        """The assistant message as the upstream side saw it (record field `assistant`)."""
        c = self.completion()
        return {
            "content": c.content,
            "reasoning": c.reasoning or None,
            "tool_calls": [{"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                           for t in c.tool_calls],
        }


CONTEXT_PATTERNS = ("maximum context length", "context length", "prompt is too long", "too many tokens",
                    "max_model_len")


def classify_backend_error(status: int, body: bytes) -> GatewayError:
    """A backend HTTP error → the gateway error kind the codecs answer (DESIGN §4 error table)."""
    message = body[:2000].decode("utf-8", "replace")
    try:
        parsed = orjson.loads(body)
        err = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        if isinstance(err, dict) and err.get("message"):
            message = str(err["message"])
    except orjson.JSONDecodeError:
        pass
    if status == 429:
        return GatewayError("rate_limited", message or "backend rate limit", 429)
    if status in (400, 413, 422) and any(p in message.lower() for p in CONTEXT_PATTERNS):
        return GatewayError("context_overflow", message, 400)
    if 400 <= status < 500 and status not in (401, 403, 404, 408):
        return GatewayError("bad_request", message or f"backend answered {status}", 400)
    # No status override: the provider's own "unavailable" status (529/503) applies to every backend 5xx/401/404
    # (DESIGN §4 table); the backend's status is kept in the record's error map by the caller.
    return GatewayError("unavailable", f"backend answered {status}: {message[:500]}")


# ---------------------------------------------------------------------------------------------------- stream client

class StreamClient:
    """A minimal HTTP/1.1 keep-alive client for the one hot request, the streamed chat call to a plain-http backend.

    Same surface as the httpx.AsyncClient subset the call driver uses (build_request, send(stream=True), and a
    response with status_code, aiter_raw, aread, aclose) and the same httpx exception classes, so failures are
    classified exactly as before. Why: httpx yields one item per HTTP chunk through several async layers, and
    vLLM sends every SSE event as its own chunk; this client yields once per network read. Measured on a 35-chunk
    stream: ~1.2 ms CPU per call with httpx, ~0.12 ms with a raw reader (BENCHMARKS.md). Only `http://` URLs;
    anything else stays on httpx."""

    MAX_IDLE = 512
    MAX_HEAD = 1 << 16

    def __init__(self, base_url: str, headers: dict, connect_timeout: float, write_timeout: float = 60.0):
        from urllib.parse import urlsplit

        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"StreamClient serves plain http URLs only, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.authority = parts.netloc.rpartition("@")[2]
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.connect_timeout = connect_timeout
        self.write_timeout = write_timeout
        self._idle: list = []

    def build_request(self, method: str, url: str, content: bytes = b"", headers: dict | None = None) -> tuple:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        merged = dict(self.headers)
        for k, v in (headers or {}).items():
            merged[k.lower()] = v
        merged["host"] = self.authority
        merged["content-length"] = str(len(content))
        merged.setdefault("accept", "*/*")
        head = "".join(f"{k}: {v}\r\n" for k, v in merged.items())
        return method, target, f"{method} {target} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + content

    async def _open(self):
        import asyncio

        import httpx

        try:
            return await asyncio.wait_for(asyncio.open_connection(self.host, self.port, limit=self.MAX_HEAD),
                                          self.connect_timeout)
        except asyncio.TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connect to {self.authority} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{exc}") from exc

    async def send(self, request: tuple, stream: bool = True) -> "_StreamResponse":
        import asyncio

        import httpx

        _method, _target, data = request
        while self._idle:
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing() or reader._buffer:  # closed or garbage while idle: not reusable
                writer.close()
                continue
            try:
                return await self._exchange(reader, writer, data)
            except _Stale:
                writer.close()  # the backend closed the idle connection first: retry once on a new one
                break
        reader, writer = await self._open()
        try:
            return await self._exchange(reader, writer, data)
        except _Stale as exc:
            writer.close()
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.") from exc
        except asyncio.CancelledError:
            writer.close()
            raise

    async def _exchange(self, reader, writer, data: bytes) -> "_StreamResponse":
        import asyncio

        import httpx

        try:
            writer.write(data)
            if writer.transport.get_write_buffer_size():
                await asyncio.wait_for(writer.drain(), self.write_timeout)
        except asyncio.TimeoutError as exc:
            writer.close()
            raise httpx.WriteTimeout("backend write timed out") from exc
        except OSError as exc:
            raise _Stale() from exc
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Stale() from exc
            writer.close()
            raise httpx.RemoteProtocolError("Server disconnected while sending the response head.") from exc
        except asyncio.LimitOverrunError as exc:
            writer.close()
            raise httpx.RemoteProtocolError("backend response head is too large") from exc
        except OSError as exc:
            raise _Stale() from exc
        except BaseException:
            writer.close()
            raise
        lines = head[:-4].split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].isdigit():
            writer.close()
            raise httpx.RemoteProtocolError(f"backend sent no HTTP/1.1 status line: {lines[0][:100]!r}")
        length, chunked, close = None, False, status_line[0] == b"HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    writer.close()
                    raise httpx.RemoteProtocolError("backend sent a bad content-length") from None
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"connection":
                close = close or b"close" in value
        return _StreamResponse(self, reader, writer, int(status_line[1]), length, chunked, close)

    def _release(self, reader, writer) -> None:
        if len(self._idle) < self.MAX_IDLE and not writer.is_closing():
            self._idle.append((reader, writer))
        else:
            writer.close()

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()


class _Stale(Exception):
    """A connection that ended before any response byte (a reused keep-alive connection the backend had closed)."""


class _StreamResponse:
    def __init__(self, client: StreamClient, reader, writer, status: int, length: int | None, chunked: bool,
                 close: bool):
        self._client, self._reader, self._writer = client, reader, writer
        self.status_code = status
        self._length = length
        self._chunked = chunked
        self._close = close or (length is None and not chunked)  # close-delimited body
        self._complete = False
        self._closed = False

    async def aiter_raw(self):
        """The body as it arrives, chunked framing removed: one item per network read."""
        import httpx

        reader = self._reader
        if self._complete:
            return
        try:
            if not self._chunked:
                left = self._length
                while left is None or left > 0:
                    data = await reader.read(1 << 16 if left is None else min(left, 1 << 16))
                    if not data:
                        if left is None:
                            break
                        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
                    if left is not None:
                        left -= len(data)
                    yield data
                self._complete = True
                return
            buf = bytearray()
            left = 0  # data bytes left in the current chunk
            skip = 0  # CRLF bytes left after the current chunk's data
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    raise httpx.RemoteProtocolError(
                        "peer closed connection without sending complete message body: incomplete chunked read")
                buf += data
                out = []
                while buf:
                    if left:
                        take = min(left, len(buf))
                        out.append(bytes(buf[:take]))
                        del buf[:take]
                        left -= take
                        continue
                    if skip:
                        take = min(skip, len(buf))
                        del buf[:take]
                        skip -= take
                        continue
                    end = buf.find(b"\r\n")
                    if end < 0:
                        if len(buf) > 4096:
                            raise httpx.RemoteProtocolError("bad chunk size line from the backend")
                        break
                    try:
                        size = int(bytes(buf[:end]).split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise httpx.RemoteProtocolError("bad chunk size line from the backend") from None
                    if size == 0:
                        # Last chunk: then the blank line, after optional trailer lines.
                        rest = bytes(buf[end + 2:])
                        while not (rest.startswith(b"\r\n") or b"\r\n\r\n" in rest):
                            more = await reader.read(4096)
                            if not more:
                                raise httpx.RemoteProtocolError("peer closed connection inside the last chunk")
                            rest += more
                        stop = 2 if rest.startswith(b"\r\n") else rest.index(b"\r\n\r\n") + 4
                        if len(rest) > stop:
                            self._close = True  # bytes after the response: never reuse this connection
                        if out:
                            yield b"".join(out)
                        self._complete = True
                        return
                    del buf[:end + 2]
                    left, skip = size, 2
                if out:
                    yield b"".join(out)
        except OSError as exc:
            raise httpx.ReadError(f"backend connection broke: {exc!r}") from exc

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self.aiter_raw()])

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._complete and not self._close:
            self._client._release(self._reader, self._writer)
        else:
            self._writer.close()
