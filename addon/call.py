"""The call driver: one provider call, in the order of docs/architecture.md (one call, end to end) — admit → translate →
shape → stream → finish.

- admit: the body fits `polar_max_body_mb`, decodes, is a JSON object; disk space for its record; the backend known.
- translate: the session, then the codec's `to_chat` (the agent's request as an OpenAI chat plan); then the replica
  that serves the call (`pool.Pool.choose`: the session's own under the sticky policy).
- shape: `shaping.shape` writes the upstream body (exact mode hands it spliced prompt ids; `/tokenize` is asked
  only when max_tokens could overflow the context).
- stream: waits while the control endpoints hold generation (a weight reload), stamps the policy version current
  at the send (`weight_version`), then the backend's SSE read chunk by chunk (`stream_reader`), translated by the
  codec's Encoder as it arrives.
- finish: one ending for both response shapes (streamed events or one JSON body), one mid-stream error path.

A call that fails before its first byte (the replica refuses the connection, breaks it, or is ejected meanwhile) is
tried once more on the next replica of the pool: one record, `replicas_tried` naming both. After the first byte the
agent gets the protocol's retryable error.

The record belongs to the `Recorder`; every ending seals it before the agent's last bytes, and every generation
request that fails still writes one, with `error` set. The codec is used only through `codecs.base.Codec`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import orjson

from polar import records as rec
from polar.records import FlowWriter, LowDiskSpace

from . import sessions
from .backend import Backend, BackendTimeout
from .http_client import Cut
from .pool import Pool, Replica
from .codecs import ROUTERS, find_route
from .codecs.base import ChatPlan, EncodeContext, GatewayError
from .endpoint import ClientGone, Responder
from .recorder import Recorder
from .shaping import BackendInfo, Shaped, prompt_size_bound, shape
from .stream_reader import StreamReader, classify_backend_error

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
    control: object = None  # control.Control: the hold gate and the weight version (None: never held, no version)
    announce: object = None  # announce.Announcer: a runner told of each arriving call (None: polar_announce unset)


@dataclass
class PendingCall:
    """A provider request, handed from the `request` hook to the endpoint in memory (never over the wire)."""

    record_id: str
    conn_id: str
    host: str
    method: str
    path: str  # without key=
    headers: list[tuple[str, str]]
    body: bytes  # decoded (its content-encoding undone)
    conn_user: str | None
    t_start: float
    decode_error: str | None = None
    connect: str = "proxy"  # how the agent reached us: proxy | base_url (the record's `connect`)
    path_session: str | None = None  # base-URL mode: the session the path prefix names (/s/<session>/)


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


async def handle_call(p: PendingCall, responder: Responder, settings: CallSettings, pool: Pool,
                      writer: FlowWriter) -> None:
    found = find_route(p.method, p.host, p.path, p.headers)
    if found is None:
        # A provider host, but no codec knows this path: a generic fast 404, never the real host.
        await responder.respond(404, [("content-type", "application/json")],
                                orjson.dumps({"error": {"message": f"unknown endpoint {p.path}", "type": "not_found"}}))
        return
    codec, route = found
    if route.kind in ("not_found", "websocket"):
        err = (GatewayError("not_found", f"{p.method} {p.path} is not served here") if route.kind == "not_found"
               else GatewayError("websocket", "WebSocket is not supported; use HTTPS"))
        status, body = codec.error_response(err)
        await responder.respond(status, _json_headers(codec), body)
        return
    await Call(p, responder, settings, pool, writer, codec, route).run()


class Answered(Exception):
    """The call was answered early (a provider error before any response byte); carries the status sent."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class Call:
    def __init__(self, p: PendingCall, responder: Responder, settings: CallSettings, pool: Pool,
                 writer: FlowWriter, codec, route):
        self.p, self.responder, self.settings, self.pool = p, responder, settings, pool
        self.replica: Replica | None = None  # the serving replica (`_pick`), counted in its in_flight until the end
        self.backend: Backend | None = None  # its client
        self.tried: list[Replica] = []
        self.codec, self.route = codec, route
        self.rec = Recorder(writer, settings.exact, id=p.record_id, session_source="none", conn_id=p.conn_id,
                            connect=p.connect, protocol=codec.PROTOCOL, host=p.host, path=p.path, stream=bool(route.stream),
                            t_start=p.t_start, request=p.body, request_headers=rec.redact_headers(p.headers),
                            model_requested=route.model)
        self.plan: ChatPlan | None = None
        self.encoder = None

    # ---------------------------------------------------------------------------------------------- the sequence

    async def run(self) -> None:
        status = None
        try:
            status = await self._sequence()
        except Answered as done:
            status = done.status
        except ClientGone:
            self.rec.error("client_abort", GatewayError("unavailable", "the agent closed the connection"), None)
        except Exception as exc:  # noqa: BLE001 — a bug here must still answer the agent and write the record
            log.exception("polar: call %s failed", self.p.record_id)
            err = GatewayError("unavailable", f"gateway error: {exc!r}")
            self.rec.error("record" if self.rec.sealed else "backend_stream", err, None)
            status = await self._end_in_error(err)
        finally:
            if self.replica is not None:
                self.replica.in_flight -= 1
            if self.rec.record["provider_status"] is None:
                self.rec.set(provider_status=status or self.responder.status)
            if self.route.kind == "generate":
                self.rec.close()

    async def _sequence(self) -> int:
        body = await self._admit_request()
        plan = await self._translate(body)
        await self._pick()
        if self.route.kind == "count_tokens":
            return await self._count_tokens(plan)
        info = await self._admit_generation()
        if self.settings.announce is not None:  # before the backend sees it: the agent now waits on the model
            await self.settings.announce.call_arrived(self.rec.record.get("session"), self.p.record_id)
        shaped = await self._shape(plan, info)
        return await self._stream(info, shaped)

    # ---------------------------------------------------------------------------------------------- admit

    async def _admit_request(self) -> dict:
        p = self.p
        if len(p.body) > self.settings.max_body_bytes:
            await self._refuse("agent_input", GatewayError(
                "too_large", f"request body of {len(p.body)} bytes exceeds polar_max_body_mb "
                             f"({self.settings.max_body_bytes} bytes)"))
        if p.decode_error:
            await self._refuse("agent_input", GatewayError("bad_request", p.decode_error))
        try:
            body = orjson.loads(p.body) if p.body else None
        except orjson.JSONDecodeError as exc:
            await self._refuse("agent_input", GatewayError("bad_request", f"request body is not valid JSON: {exc}"))
        if not isinstance(body, dict):
            await self._refuse("agent_input", GatewayError("bad_request", "request body must be a JSON object"))
        return body

    async def _admit_generation(self) -> BackendInfo:
        try:
            self.rec.writer.check_space()
        except LowDiskSpace as exc:
            # No generation goes unrecorded: refuse with the provider's retryable error, and log it.
            log.error("polar: %s", exc)
            self.rec.skip()  # there is no room for a record either
            status, body = self.codec.error_response(GatewayError("unavailable", f"{exc}; retry later"))
            await self.responder.respond(status, _json_headers(self.codec), body)
            raise Answered(status) from None
        while True:
            try:
                info = await self.backend.info()
                break
            except GatewayError as err:
                self.backend.forget()
                if not await self._next_replica(err.message):
                    await self._refuse("backend_timeout" if isinstance(err, BackendTimeout) else "backend_connect",
                                       err)
        self.rec.set(model_served=info.model, backend={"kind": info.kind, "version": info.version,
                                                        "system_fingerprint": None},
                     template_hash=info.template_hash)
        return info

    # ---------------------------------------------------------------------------------------------- the replica

    async def _pick(self) -> None:
        """The replica for this call (the pool checked once before its first call); a pool with every replica
        ejected answers the protocol's retryable error."""
        pool = self.pool
        await pool.ready()
        replica = pool.choose(self.rec.record.get("session"))
        if replica is None:
            await self._refuse("backend_connect", GatewayError("unavailable", _none_left(pool)))
        self._take(replica)

    def _take(self, replica: Replica) -> None:
        if self.replica is not None:
            self.replica.in_flight -= 1
        self.replica, self.backend = replica, replica.backend
        replica.in_flight += 1
        replica.served += 1
        self.tried.append(replica)
        self.rec.set(replica=replica.url)
        if len(self.tried) > 1:
            self.rec.set(replicas_tried=[r.url for r in self.tried])

    async def _next_replica(self, reason: str, eject: bool = True) -> bool:
        """After a failure before the first byte: eject the replica (it refused or broke the connection) and move the
        call to the next one, once. False when the call stays where it is (no retry left, no replica left)."""
        if len(self.pool.replicas) < 2:
            return False
        if eject:
            self.pool.eject(self.replica, reason)
        if len(self.tried) > 1:
            return False
        nxt = self.pool.choose(self.rec.record.get("session"), exclude=self.tried)
        if nxt is None:
            return False
        log.warning("polar: call %s retried on %s after %s failed: %s", self.p.record_id, nxt.url, self.replica.url,
                    reason)
        self.pool.retries += 1
        self._take(nxt)
        return True

    # ---------------------------------------------------------------------------------------------- translate

    async def _translate(self, body: dict) -> ChatPlan:
        p = self.p
        key = self.codec.session_key(p.headers, body)
        session, source = sessions.resolve(p.conn_user, p.headers, key, p.path_session)
        self.rec.set(session=session, session_source=source)
        try:
            plan = self.codec.to_chat(body, self.route)
            orjson.dumps(plan.chat)  # orjson refuses nesting deeper than 255 levels, which loads() accepts
        except GatewayError as err:
            await self._refuse("agent_input", err)
        except orjson.JSONEncodeError as exc:
            await self._refuse("agent_input", GatewayError("bad_request", f"request cannot be forwarded: {exc}"))
        self.plan = plan
        self.rec.set(stream=plan.stream, model_requested=plan.model_requested or self.route.model)
        self.rec.note(*plan.normalizations)
        return plan

    async def _count_tokens(self, plan: ChatPlan) -> int:
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

    # ---------------------------------------------------------------------------------------------- shape

    async def _shape(self, plan: ChatPlan, info: BackendInfo) -> Shaped:
        def shaped(**prompt) -> Shaped:
            return shape(plan.chat, backend=info, agent_top_logprobs=plan.agent_top_logprobs,
                         logprobs_mode=self.settings.logprobs_mode, sampling_override=self.settings.sampling_override,
                         thinking=plan.extra.get("thinking"), thinking_kwarg=self.settings.thinking_kwarg,
                         session=self.rec.record.get("session"), **prompt)

        result = None
        if self.settings.exact is not None:
            # Exact on-policy mode: the spliced prompt ids, or the record says why the normal path answers.
            draft = shaped()
            turn = await self.settings.exact.prepare(self.backend, info, draft.body, self.rec.record["session"],
                                                     flows=self.rec.writer.directory)
            self.rec.exact_turn = turn
            if turn.sent is not None:
                result = shaped(prompt_ids=turn.sent)
        if result is None:
            result = shaped(prompt_len=await self._prompt_len(plan, info))
        self.rec.note(*result.normalizations)
        self.rec.set(sampling=result.sampling, constrained=rec.is_constrained(result.body),
                     upstream_request=orjson.dumps(result.body))
        return result

    async def _prompt_len(self, plan: ChatPlan, info: BackendInfo) -> int | None:
        """The prompt's length when max_tokens could overflow the context (else None: /tokenize is not asked)."""
        requested = plan.chat.get("max_tokens")
        if not info.max_model_len or requested is None:
            return None
        bound = prompt_size_bound(plan.chat)
        if requested + bound <= info.max_model_len:
            return None
        try:
            prompt_len = await self.backend.tokenize(plan.chat, info.model)
        except GatewayError as err:
            if not (info.kind == "sglang" and err.status is not None and bound < info.max_model_len):
                await self._refuse("backend_status" if err.kind != "unavailable" else "backend_connect", err)
            # SGLang's /tokenize counts text, not chat messages: clamp against the prompt's upper bound (every
            # token is at least one byte), which always fits; a short budget beats a 400.
            prompt_len = bound
            self.rec.note("prompt_len_upper_bound")
        if prompt_len >= info.max_model_len:
            await self._refuse("agent_input", GatewayError(
                "context_overflow", f"prompt is too long: {prompt_len} tokens > {info.max_model_len - 1} maximum"), 400)
        return prompt_len

    # ---------------------------------------------------------------------------------------------- stream

    async def _stream(self, info: BackendInfo, shaped: Shaped) -> int:
        # Held (a weight reload): wait here, before the backend sees the request; the hold wait is not part of
        # polar_first_byte_timeout. The version is the one current when the request is sent.
        gate = self.settings.control.generation() if self.settings.control is not None \
            else contextlib.nullcontext(None)
        async with gate as weight_version:
            self.rec.set(weight_version=weight_version)
            return await self._send(info, shaped)

    async def _send(self, info: BackendInfo, shaped: Shaped) -> int:
        while True:
            try:
                return await self._send_once(info, shaped)
            except _BeforeFirstByte as failure:
                if not await self._next_replica(failure.message, eject=failure.eject):
                    return await self._backend_failure(failure.stage, failure.message)

    async def _send_once(self, info: BackendInfo, shaped: Shaped) -> int:
        reader = StreamReader(keep_logprob_entries=self.plan.agent_top_logprobs is not None,
                              forced_tool_choice=shaped.body.get("tool_choice"),
                              call_id_prefix=f"call_{self.p.record_id.replace('-', '')[-12:]}",
                              deltas=self.plan.stream)  # a JSON answer is built from the totals alone
        self.rec.take_stream(reader)
        client = self.backend.stream_client
        # The pool cuts this connection when it ejects the replica (the lean client only: an https backend's httpx
        # connection runs on to its timeouts).
        cut = None
        if client is None:
            client = self.backend.client
            send = client.send
        elif len(self.pool.replicas) > 1:
            cut = Cut()
            self.replica.cuts.add(cut)
            send = functools.partial(client.send, cut=cut)
        else:
            send = client.send
        # polar_first_byte_timeout bounds everything up to the first chunk, response headers included (a backend
        # that never sends its status line must not hold the call forever: the client's read timeout is off).
        deadline = time.monotonic() + self.settings.first_byte_timeout
        try:
            request = client.build_request("POST", f"{self.backend.base_url}/chat/completions",
                                           content=self.rec.record["upstream_request"], headers=shaped.headers)
            resp = await asyncio.wait_for(send(request, stream=True), self.settings.first_byte_timeout)
            try:
                if resp.status_code != 200:
                    body = await asyncio.wait_for(resp.aread(), max(deadline - time.monotonic(), 0.001))
                    await self._refuse("backend_status", classify_backend_error(resp.status_code, body),
                                       resp.status_code)
                return await self._relay(resp.aiter_raw(), reader, info, deadline)
            finally:
                await resp.aclose()
        except httpx.ConnectTimeout as exc:
            self.backend.forget()
            return await self._failed(reader, "backend_timeout", f"backend connect timeout: {exc!r}", eject=True)
        except (httpx.ConnectError, httpx.UnsupportedProtocol) as exc:
            self.backend.forget()
            return await self._failed(reader, "backend_connect", f"backend unreachable: {exc!r}", eject=True)
        except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
            return await self._failed(reader, "backend_timeout", f"backend timed out: {exc!r}", eject=False)
        except httpx.HTTPError as exc:
            # a broken exchange is retried elsewhere but ejects nothing: the probe judges the replica
            return await self._failed(reader, "backend_stream", f"backend stream broke: {exc!r}", eject=False)
        except GatewayError as err:
            return await self._backend_failure("backend_stream", err.message)
        finally:
            if cut is not None:
                self.replica.cuts.discard(cut)

    async def _failed(self, reader: StreamReader, stage: str, message: str, eject: bool) -> int:
        """A backend failure: before any chunk reached the agent it may move the call (`_send`); else it ends it.
        `eject`: the failure is the replica's (already done when the pool cut the connection itself)."""
        if self.encoder is None and not self.responder.started and not reader.chunks:
            raise _BeforeFirstByte(stage, message, eject)
        return await self._backend_failure(stage, message)

    async def _relay(self, chunks, reader: StreamReader, info: BackendInfo, deadline: float) -> int:
        stream = self.plan.stream
        replica = self.replica
        first = True
        sent_head = True  # until the first chunk: nothing to send
        while not reader.done:
            try:
                # A backend that stalls mid-stream must not hold the agent forever: the idle gap is bounded too.
                timeout = max(deadline - time.monotonic(), 0.001) if first else self.settings.idle_timeout
                data = await asyncio.wait_for(chunks.__anext__(), timeout)
            except StopAsyncIteration:
                break
            replica.last_data = time.monotonic()  # evidence of life for the pool's probe (pool._probe_failed)
            deltas = reader.feed(data)
            pending: list[bytes] = []
            if first and reader.chunks:
                first = False
                self._make_encoder(info, reader)
                if stream:
                    await self.responder.start(200, [("content-type", self.codec.stream_content_type(self.route)),
                                                     ("cache-control", "no-cache")])
                    self.rec.set(t_first_byte=time.time())
                    sent_head = False
                    pending.extend(self.encoder.start())
            if stream:
                # Everything one backend read produced leaves in one write (the head too, after the first chunk):
                # as live as the backend, fewer segments for mitmproxy to relay.
                for d in deltas:
                    pending.extend(self.encoder.delta(d))
                if pending or not sent_head:
                    await self.responder.send(b"".join(pending))
                    sent_head = True
        if reader.finish_reason is None:
            raise GatewayError("unavailable", "backend stream ended before a finish reason")
        if self.encoder is None:
            self._make_encoder(info, reader)
        status = await self._finish(reader)
        await _drain(chunks)
        return status

    def _make_encoder(self, info: BackendInfo, reader: StreamReader) -> None:
        prompt_tokens = reader.prompt_count()
        ctx = EncodeContext(plan=self.plan, route=self.route, response_id=self.p.record_id.replace("-", ""),
                            model=self.plan.model_requested or self.route.model or info.model,
                            prompt_tokens=prompt_tokens, created=int(self.p.t_start))
        self.encoder = self.codec.Encoder(ctx)

    # ---------------------------------------------------------------------------------------------- finish

    async def _finish(self, reader: StreamReader) -> int:
        """The one successful ending, for both response shapes: closing bytes built, record sealed, bytes sent."""
        completion = reader.completion()
        self.rec.set(provider_stop_reason=self.codec.provider_stop_reason(completion, self.plan))
        if reader.forced_from_content:
            self.rec.note("forced_tool_call_parsed_from_content")
        if reader.prompt_ids_path is None or reader.completion_token_ids is None:
            self.rec.note("backend_gave_no_token_ids")
        if reader.prompt_ids_path is not None and self.settings.control is not None:
            self.settings.control.prompt_ids[reader.prompt_ids_path] += 1
        if self.plan.stream:
            last = b"".join(self.encoder.finish(completion))
        else:
            last = orjson.dumps(self.encoder.response(completion))
            self.rec.set(t_first_byte=time.time())
        self.rec.note(*self.encoder.notes)
        self.rec.set(provider_status=200)
        self.rec.seal()  # on disk before the last byte; RecordLost ends the call in the protocol's error instead
        if not self.plan.stream:
            await self.responder.respond(200, _json_headers(self.codec), last)
            return 200
        await self.responder.end(last)  # the closing events and the end of the body: one write
        return 200

    async def _refuse(self, stage: str, err: GatewayError, status_hint: int | None = None) -> None:
        """A failure before response headers: the provider's error, the record sealed before the body is sent."""
        self.rec.error(stage, err, status_hint)
        status, body = self.codec.error_response(err)
        self.rec.set(provider_status=status)
        if self.route.kind == "generate":
            self.rec.close()
        await self.responder.respond(status, _json_headers(self.codec), body)
        raise Answered(status)

    async def _backend_failure(self, stage: str, message: str) -> int:
        err = GatewayError("unavailable", message)
        if not self.responder.started:
            await self._refuse(stage, err)
        self.rec.error(stage, err, self.responder.status)
        return await self._end_in_error(err)

    async def _end_in_error(self, err: GatewayError) -> int | None:
        """The one error ending once anything may have been sent: before headers the provider's error; mid-stream
        the protocol's error event after the record is sealed; a stream already complete is cut, never re-ended."""
        try:
            if not self.responder.started:
                status, body = self.codec.error_response(err)
                self.rec.set(provider_status=status)
                self.rec.close()
                await self.responder.respond(status, _json_headers(self.codec), body)
                return status
            self.rec.set(provider_status=self.responder.status)  # what the agent got: the stream's status
            self.rec.close()
            if self.responder.finished:
                return self.responder.status
            pieces = self.encoder.error(err) if self.encoder is not None else []
            if not pieces and self.encoder is not None:
                # The encoder has already ended its stream (e.g. the record failed after finish()): cut the
                # connection rather than end a body that would read as a complete answer.
                self.responder.abort()
            await self.responder.end(*pieces)
        except ClientGone:
            pass
        return self.responder.status


class _BeforeFirstByte(Exception):
    def __init__(self, stage: str, message: str, eject: bool):
        super().__init__(message)
        self.stage, self.message, self.eject = stage, message, eject


def _none_left(pool: Pool) -> str:
    reasons = "; ".join(f"{r.url}: {r.reason}" for r in pool.replicas if not r.healthy)
    return f"no backend replica is serving ({reasons}); retry later"


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
