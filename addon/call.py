"""One provider call, end to end: route → translate → shape → backend stream → translate back → record.

Order matters for the record promise: the record is written before the agent receives the last byte of its
response, and every generation request that fails still writes one, with `error` set.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import orjson

from . import record as rec
from . import sessions
from .backend import Backend, BackendTimeout
from .codecs import ROUTERS, find_route
from .codecs.base import EncodeContext, GatewayError
from .endpoint import ClientGone, Responder
from .record import FlowWriter, LowDiskSpace
from .upstream import StreamReader, classify_backend_error, prompt_size_bound, shape

log = logging.getLogger("polar.call")


@dataclass(frozen=True)
class CallSettings:
    max_body_bytes: int
    connect_timeout: float
    first_byte_timeout: float
    idle_timeout: float
    logprobs_mode: str
    thinking_kwarg: str | None
    sampling_override: dict
    exact: object = None  # exact.ExactMode when polar_exact is on


@dataclass
class PendingCall:
    """A provider request, handed from the `request` hook to the endpoint in memory (never over the wire)."""

    record_id: str
    conn_id: str
    host: str
    port: int
    method: str
    path: str  # without key=
    raw_path: str
    headers: list[tuple[str, str]]
    body: bytes
    content_encoding: str | None
    conn_user: str | None
    t_start: float
    decode_error: str | None = None
    extra: dict = field(default_factory=dict)


def strip_key_param(path: str) -> tuple[str, bool]:
    """Remove `key=` (Google API keys) from a path's query; returns (path, whether one was removed)."""
    parts = urlsplit(path)
    if not parts.query:
        return path, False
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if k.lower() != "key"]
    if len(kept) == len(pairs):
        return path, False
    return urlunsplit(("", "", parts.path, urlencode(kept), "")), True


def _json_headers(codec) -> list[tuple[str, str]]:
    return [("content-type", codec.JSON_CONTENT_TYPE)]


async def _send_error(responder: Responder, codec, err: GatewayError) -> int:
    status, body = codec.error_response(err)
    await responder.respond(status, _json_headers(codec), body)
    return status


async def handle_call(p: PendingCall, responder: Responder, settings: CallSettings, backend: Backend,
                      writer: FlowWriter) -> None:
    headers = p.headers
    found = find_route(p.method, p.host, p.path, headers)
    if found is None:
        # A provider host, but no codec knows this path: a generic fast 404, never the real host.
        await responder.respond(404, [("content-type", "application/json")],
                                orjson.dumps({"error": {"message": f"unknown endpoint {p.path}", "type": "not_found"}}))
        return
    codec, route = found
    if route.kind == "not_found":
        await _send_error(responder, codec, GatewayError("not_found", f"{p.method} {p.path} is not served here"))
        return
    if route.kind == "websocket":
        await _send_error(responder, codec, GatewayError("websocket", "WebSocket is not supported; use HTTPS"))
        return

    call = _Call(p, responder, settings, backend, writer, codec, route)
    await call.run()


class _Call:
    def __init__(self, p: PendingCall, responder: Responder, settings: CallSettings, backend: Backend,
                 writer: FlowWriter, codec, route):
        self.p, self.responder, self.settings, self.backend, self.writer = p, responder, settings, backend, writer
        self.codec, self.route = codec, route
        self.record: dict = {
            "v": rec.VERSION, "id": p.record_id, "session": None, "session_source": "none", "conn_id": p.conn_id,
            "protocol": codec.PROTOCOL, "host": p.host, "path": p.path, "stream": bool(route.stream),
            "t_start": p.t_start, "t_first_byte": None, "t_end": None, "request": p.body,
            "request_headers": rec.redact_headers(p.headers), "upstream_request": None,
            "model_requested": route.model, "model_served": None, "prompt_token_ids": None,
            "completion_token_ids": None, "completion_logprobs": None, "finish_reason": None, "stop_reason": None,
            "usage": None, "provider_status": None, "provider_stop_reason": None, "assistant": None,
            "sampling": None, "backend": None, "weight_versions": None, "normalizations": [], "error": None,
        }
        self.plan = None
        self.reader: StreamReader | None = None
        self.encoder = None
        self.recorded = False
        self.record_error: OSError | None = None
        self.exact_turn = None  # exact.ExactTurn when polar_exact is on

    # ---------------------------------------------------------------------------------------------- record

    def _error(self, stage: str, err: GatewayError, status: int | None) -> None:
        self.record["error"] = {"stage": stage, "status": status, "type": err.kind, "message": err.message[:4000]}

    def _write_record(self) -> None:
        if self.recorded:
            return
        self.recorded = True
        r = self.record
        r["t_end"] = time.time()
        if self.reader is not None:
            rd = self.reader
            r["prompt_token_ids"] = rec.pack_ids(rd.prompt_token_ids)
            r["completion_token_ids"] = rec.pack_ids(rd.completion_token_ids)
            r["completion_logprobs"] = (rec.pack_floats(rd.logprobs)
                                        if rd.logprobs is not None and not rd.missing_logprobs
                                        and len(rd.logprobs) == len(rd.completion_token_ids or ()) else None)
            r["finish_reason"] = rd.finish_reason
            r["stop_reason"] = rd.stop_reason
            r["usage"] = rd.usage
            r["assistant"] = rd.assistant_message()
            r["weight_versions"] = rd.weight_versions
            if r["backend"] is not None:
                r["backend"]["system_fingerprint"] = rd.system_fingerprint
            if rd.model:
                r["model_served"] = rd.model
        try:
            if self.exact_turn is not None:
                self.settings.exact.finish(self.exact_turn, r, self.reader.prompt_token_ids if self.reader else None)
            self.writer.write(r)
            if self.exact_turn is not None and self.reader is not None:
                self.settings.exact.commit(self.exact_turn, r, self.reader.prompt_token_ids,
                                           self.reader.completion_token_ids, r["assistant"])
        except OSError as exc:
            # The writer has already cut the file back and moved to a new one. The caller must not send a
            # successful ending after this (no generation goes unrecorded): see _check_recorded.
            log.error("polar: could not write record %s: %s", r["id"], exc)
            self.record_error = exc

    def _check_recorded(self) -> None:
        """Raise when the record could not be written: run() then answers with the protocol's error instead of a
        successful ending (stage `record`), so the agent retries rather than keep an answer nobody recorded."""
        if self.record_error is not None:
            raise RuntimeError(f"the flow record could not be written: {self.record_error}")

    # ---------------------------------------------------------------------------------------------- flow

    async def run(self) -> None:
        status = None
        try:
            status = await self._run()
        except ClientGone:
            if self.record["error"] is None:
                self._error("client_abort", GatewayError("unavailable", "the agent closed the connection"), None)
        except Exception as exc:  # noqa: BLE001 — a bug here must still answer the agent and write the record
            log.exception("polar: call %s failed", self.p.record_id)
            err = GatewayError("unavailable", f"gateway error: {exc!r}")
            if self.record["error"] is None:
                self._error("record" if self.recorded else "backend_stream", err, None)
            try:
                if not self.responder.started:
                    status = await _send_error(self.responder, self.codec, err)
                elif self.encoder is not None and not self.responder.finished:
                    pieces = self.encoder.error(err)
                    if not pieces:
                        # The encoder has already ended its stream (e.g. the record failed after finish()):
                        # cut the connection rather than end a body that would read as a complete answer.
                        self.responder.abort()
                    for piece in pieces:
                        await self.responder.send(piece)
                    await self.responder.end()
            except ClientGone:
                pass
        finally:
            if self.record["provider_status"] is None:
                self.record["provider_status"] = status or self.responder.status
            if self.route.kind == "generate":
                self._write_record()

    async def _fail(self, stage: str, err: GatewayError, status_hint: int | None = None) -> int:
        """A failure before response headers: the provider's error; record written before the body is sent."""
        self._error(stage, err, status_hint)
        status, body = self.codec.error_response(err)
        self.record["provider_status"] = status
        if self.route.kind == "generate":
            self._write_record()
        await self.responder.respond(status, _json_headers(self.codec), body)
        return status

    async def _run(self) -> int:
        p, codec = self.p, self.codec
        if len(p.body) > self.settings.max_body_bytes:
            return await self._fail("agent_input", GatewayError(
                "too_large", f"request body of {len(p.body)} bytes exceeds polar_max_body_mb "
                             f"({self.settings.max_body_bytes} bytes)"), None)
        if p.decode_error:
            return await self._fail("agent_input", GatewayError("bad_request", p.decode_error))
        try:
            body = orjson.loads(p.body) if p.body else None
        except orjson.JSONDecodeError as exc:
            return await self._fail("agent_input", GatewayError("bad_request", f"request body is not valid JSON: {exc}"))
        if not isinstance(body, dict):
            return await self._fail("agent_input", GatewayError("bad_request", "request body must be a JSON object"))

        key = codec.session_key(p.headers, body)
        self.record["session"], self.record["session_source"] = sessions.resolve(p.conn_user, p.headers, key)
        try:
            plan = codec.to_chat(body, self.route)
        except GatewayError as err:
            return await self._fail("agent_input", err)
        self.plan = plan
        try:
            orjson.dumps(plan.chat)  # orjson refuses nesting deeper than 255 levels, which loads() accepts
        except orjson.JSONEncodeError as exc:
            return await self._fail("agent_input", GatewayError("bad_request", f"request cannot be forwarded: {exc}"))
        self.record["stream"] = plan.stream
        self.record["model_requested"] = plan.model_requested or self.route.model
        self.record["normalizations"] = list(plan.normalizations)

        if self.route.kind == "count_tokens":
            return await self._count_tokens(plan)

        try:
            self.writer.check_space()
        except LowDiskSpace as exc:
            # No generation goes unrecorded: refuse with the provider's retryable error, and log it.
            log.error("polar: %s", exc)
            self.recorded = True  # there is no room for a record either
            status, body_bytes = codec.error_response(GatewayError("unavailable", f"{exc}; retry later"))
            await self.responder.respond(status, _json_headers(codec), body_bytes)
            return status

        try:
            info = await self.backend.info()
        except GatewayError as err:
            self.backend.forget()
            return await self._fail("backend_timeout" if isinstance(err, BackendTimeout) else "backend_connect", err)
        self.record["model_served"] = info.model
        self.record["backend"] = {"kind": info.kind, "version": info.version, "system_fingerprint": None}

        prompt_len = None
        requested = plan.chat.get("max_tokens")
        if info.max_model_len and requested is not None:
            bound = prompt_size_bound(plan.chat)
            if requested + bound > info.max_model_len:
                try:
                    prompt_len = await self.backend.tokenize(plan.chat, info.model)
                except GatewayError as err:
                    if not (info.kind == "sglang" and err.status is not None and bound < info.max_model_len):
                        return await self._fail("backend_status" if err.kind != "unavailable" else "backend_connect",
                                                err)
                    # SGLang's /tokenize counts text, not chat messages: clamp against the prompt's upper bound
                    # (every token is at least one byte), which always fits; a short budget beats a 400.
                    prompt_len = bound
                    self.record["normalizations"].append("prompt_len_upper_bound")
                if prompt_len >= info.max_model_len:
                    return await self._fail("agent_input", GatewayError(
                        "context_overflow",
                        f"prompt is too long: {prompt_len} tokens > {info.max_model_len - 1} maximum"), 400)

        shaped = shape(plan.chat, backend=info, agent_top_logprobs=plan.agent_top_logprobs,
                       logprobs_mode=self.settings.logprobs_mode, sampling_override=self.settings.sampling_override,
                       thinking=plan.extra.get("thinking"), thinking_kwarg=self.settings.thinking_kwarg,
                       prompt_len=prompt_len)
        self.record["normalizations"].extend(shaped.normalizations)
        self.record["sampling"] = shaped.sampling
        self.forced_tool_choice = shaped.body.get("tool_choice")
        if self.settings.exact is not None:
            # Exact on-policy mode: the spliced prompt ids go into shaped.body (or the record says why not).
            self.exact_turn = await self.settings.exact.prepare(self.backend, info, shaped, self.record["session"])
        upstream_body = orjson.dumps(shaped.body)
        self.record["upstream_request"] = upstream_body
        return await self._generate(info, upstream_body, shaped.headers)

    async def _count_tokens(self, plan) -> int:
        try:
            info = await self.backend.info()
            n = await self.backend.tokenize(plan.chat, info.model)
        except GatewayError as err:
            status, body = self.codec.error_response(err)
            await self.responder.respond(status, _json_headers(self.codec), body)
            return status
        doc = self.codec.count_tokens_response(n, self.route)
        await self.responder.respond(200, _json_headers(self.codec), orjson.dumps(doc))
        return 200

    async def _generate(self, info, upstream_body: bytes, extra_headers: dict) -> int:
        plan = self.plan
        self.reader = reader = StreamReader(keep_logprob_entries=plan.agent_top_logprobs is not None,
                                            forced_tool_choice=self.forced_tool_choice,
                                            call_id_prefix=f"call_{self.p.record_id.replace('-', '')[-12:]}")
        url = f"{self.backend.base_url}/chat/completions"
        client = getattr(self.backend, "stream_client", None) or self.backend.client
        # polar_first_byte_timeout bounds everything up to the first chunk, response headers included (a backend
        # that never sends its status line must not hold the call forever: the client's read timeout is off).
        deadline = time.monotonic() + self.settings.first_byte_timeout
        try:
            request = client.build_request("POST", url, content=upstream_body, headers=extra_headers)
            resp = await asyncio.wait_for(client.send(request, stream=True), self.settings.first_byte_timeout)
            try:
                if resp.status_code != 200:
                    body = await asyncio.wait_for(resp.aread(), max(deadline - time.monotonic(), 0.001))
                    err = classify_backend_error(resp.status_code, body)
                    return await self._fail("backend_status", err, resp.status_code)
                return await self._relay(resp, reader, info, deadline)
            finally:
                await resp.aclose()
        except httpx.ConnectTimeout as exc:
            self.backend.forget()
            return await self._backend_failure("backend_timeout", f"backend connect timeout: {exc!r}")
        except (httpx.ConnectError, httpx.UnsupportedProtocol) as exc:
            self.backend.forget()
            return await self._backend_failure("backend_connect", f"backend unreachable: {exc!r}")
        except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
            return await self._backend_failure("backend_timeout", f"backend timed out: {exc!r}")
        except httpx.HTTPError as exc:
            return await self._backend_failure("backend_stream", f"backend stream broke: {exc!r}")
        except GatewayError as err:
            return await self._backend_failure("backend_stream", err.message)

    async def _backend_failure(self, stage: str, message: str) -> int:
        err = GatewayError("unavailable", message)
        if not self.responder.started:
            return await self._fail(stage, err)
        # Mid-stream: the protocol's error event; record first, then the last bytes.
        self._error(stage, err, self.responder.status)
        self.record["provider_status"] = self.responder.status  # what the agent got: the stream's status
        self._write_record()
        if self.encoder is not None:
            for piece in self.encoder.error(err):
                await self.responder.send(piece)
        await self.responder.end()
        return self.responder.status or 200

    def _make_encoder(self, info) -> None:
        prompt_tokens = len(self.reader.prompt_token_ids) if self.reader.prompt_token_ids is not None else None
        ctx = EncodeContext(plan=self.plan, route=self.route, response_id=self.p.record_id.replace("-", ""),
                            model=self.plan.model_requested or self.route.model or info.model,
                            prompt_tokens=prompt_tokens, created=int(self.p.t_start))
        self.encoder = self.codec.Encoder(ctx)

    async def _relay(self, resp: httpx.Response, reader: StreamReader, info, deadline: float) -> int:
        codec, plan = self.codec, self.plan
        stream = plan.stream
        chunks = resp.aiter_raw()
        first = True
        pending: list[bytes] = []
        while True:
            try:
                # A backend that stalls mid-stream must not hold the agent forever: the idle gap is bounded too.
                timeout = max(deadline - time.monotonic(), 0.001) if first else self.settings.idle_timeout
                data = await asyncio.wait_for(chunks.__anext__(), timeout)
            except StopAsyncIteration:
                break
            deltas = reader.feed(data)
            if first and reader.chunks:
                first = False
                self._make_encoder(info)
                if stream:
                    content_type = (codec.stream_content_type(self.route) if hasattr(codec, "stream_content_type")
                                    else codec.STREAM_CONTENT_TYPE)
                    await self.responder.start(200, [("content-type", content_type),
                                                     ("cache-control", "no-cache")])
                    self.record["t_first_byte"] = time.time()
                    pending = list(self.encoder.start())
            if stream:
                # Everything one backend read produced leaves in one write: as live as the backend, fewer segments
                # for mitmproxy to relay.
                for d in deltas:
                    pending.extend(self.encoder.delta(d))
                if pending:
                    await self.responder.send(b"".join(pending))
                    pending = []
            if reader.done:
                break
        if reader.finish_reason is None:
            raise GatewayError("unavailable", "backend stream ended before a finish reason")
        if self.encoder is None:
            self._make_encoder(info)
        completion = reader.completion()
        self.record["provider_stop_reason"] = codec.provider_stop_reason(completion, plan)
        if reader.forced_from_content:
            self.record["normalizations"].append("forced_tool_call_parsed_from_content")
        if reader.prompt_token_ids is None or reader.completion_token_ids is None:
            self.record["normalizations"].append("backend_gave_no_token_ids")
        if stream:
            pieces = self.encoder.finish(completion)
            self.record["normalizations"].extend(getattr(self.encoder, "notes", ()))
            self.record["provider_status"] = 200
            self._write_record()
            self._check_recorded()
            if pieces:
                await self.responder.send(b"".join(pieces))
            await self.responder.end()
            await _drain(chunks)
            return 200
        body = orjson.dumps(self.encoder.response(completion))
        self.record["normalizations"].extend(getattr(self.encoder, "notes", ()))
        self.record["provider_status"] = 200
        self.record["t_first_byte"] = time.time()
        self._write_record()
        self._check_recorded()
        await self.responder.respond(200, _json_headers(codec), body)
        await _drain(chunks)
        return 200


async def _drain(chunks) -> None:
    """After [DONE], read the backend response to its end (normally already buffered), after the agent has its
    answer: only a fully read response returns its connection to the pool; otherwise every call dials the backend."""
    try:
        await asyncio.wait_for(_exhaust(chunks), 1.0)
    except Exception:  # noqa: BLE001 — a backend that keeps the stream open or breaks now only loses the connection
        pass


async def _exhaust(chunks) -> None:
    async for _ in chunks:
        pass


__all__ = ["CallSettings", "PendingCall", "handle_call", "strip_key_param", "ROUTERS"]
