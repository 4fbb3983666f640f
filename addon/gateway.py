"""PolarGateway — the mitmproxy addon: decrypt provider hosts only, reroute their flows to the gateway endpoint.

Hooks, in the order a flow meets them: tls_clienthello (decrypt providers only), http_connect (proxy credentials →
session), request (reroute a provider flow to our endpoint; never let it reach the real host), responseheaders
(relay our bytes as they come). The endpoint answers each call through `call.handle_call`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from typing import Optional

import orjson
from mitmproxy import ctx, exceptions, http, tls

from . import hosts as hostlist
from . import sessions
from .backend import Backend
from .call import CallSettings, PendingCall, handle_call, strip_key_param
from .endpoint import Endpoint, Responder
from .exact import ExactMode, TurnCache
from .record import FlowWriter, uuid7
from .upstream import StreamClient, parse_sampling_override

log = logging.getLogger("polar.gateway")


async def _close_backend(backend: Backend) -> None:
    stream_client = getattr(backend, "stream_client", None)
    if stream_client is not None:
        await stream_client.aclose()
    await backend.close()

READY_HOST = "polar.gateway"  # `curl -x <proxy> http://polar.gateway/ready` — the readiness probe of scripts/proxy


NUMBER_OPTIONS = ("polar_connect_timeout", "polar_first_byte_timeout", "polar_idle_timeout", "polar_max_body_mb",
                  "polar_rotate_mb", "polar_min_free_mb")


def _number(opts, name: str) -> float:
    """A numeric option's value; positive, except polar_min_free_mb which may be 0 (check off)."""
    try:
        value = float(getattr(opts, name))
    except (TypeError, ValueError):
        raise exceptions.OptionsError(f"{name} must be a number, not {getattr(opts, name)!r}") from None
    if value < 0 or (value == 0 and name != "polar_min_free_mb") or value != value:
        raise exceptions.OptionsError(f"{name} must be positive")
    return value


class PolarGateway:
    def __init__(self) -> None:
        self.hosts = hostlist.parse_hosts(hostlist.DEFAULT_HOSTS)
        self.conn_users: dict[str, str | None] = {}
        self.pending: dict[str, PendingCall] = {}
        self.endpoint = Endpoint(self._serve)
        self.writer: FlowWriter | None = None
        self.backend: Backend | None = None
        self.settings: CallSettings | None = None
        self._loopback_forced = False
        self.exact: ExactMode | None = None

    # ------------------------------------------------------------------------------------------------ options

    def load(self, loader) -> None:
        loader.add_option("polar_upstream", str, "http://127.0.0.1:8000/v1",
                          "OpenAI-compatible backend base URL ending in /v1 (vLLM or SGLang).")
        loader.add_option("polar_flows", str, "./flows", "Directory for flow records.")
        loader.add_option("polar_model", Optional[str], None,
                          "Model sent upstream; default: the backend's first /v1/models entry.")
        loader.add_option("polar_hosts", Sequence[str], list(hostlist.DEFAULT_HOSTS),
                          "Provider hosts to decrypt and answer (exact names, host or host:port).")
        loader.add_option("polar_backend", str, "auto", "Backend kind: auto|vllm|sglang.")
        loader.add_option("polar_upstream_api_key", Optional[str], None, "API key sent to the backend.")
        # Numbers are str options: mitmproxy's --set cannot parse float options (NotImplementedError at startup).
        loader.add_option("polar_connect_timeout", str, "10", "Backend connect timeout, seconds.")
        loader.add_option("polar_first_byte_timeout", str, "600", "Backend first-chunk timeout, seconds.")
        loader.add_option("polar_idle_timeout", str, "600",
                          "Longest silence between two backend chunks once streaming, seconds.")
        loader.add_option("polar_max_body_mb", str, "32", "Largest agent request body accepted, MB.")
        loader.add_option("polar_rotate_mb", str, "256", "Rotate flow files at this size, MB.")
        loader.add_option("polar_min_free_mb", str, "512",
                          "Refuse new generations (retryable error) below this much free disk, MB (0: off).")
        loader.add_option("polar_logprobs_mode", str, "raw_logprobs",
                          "What the backend was started with: raw_logprobs|processed_logprobs.")
        loader.add_option("polar_thinking_kwarg", Optional[str], None,
                          "chat_template_kwargs key for thinking on/off (unset: thinking controls are not mapped).")
        loader.add_option("polar_sampling_override", Optional[str], None,
                          "Sampling applied to every generation, e.g. temperature=1.6,top_p=1.0.")
        loader.add_option("polar_exact", bool, False,
                          "Exact on-policy mode: splice the sampled ids into the next prompt (vLLM 0.30+).")
        loader.add_option("polar_exact_cache_mb", str, "512",
                          "Exact mode: memory bound of the per-session turn cache, MB.")
        self._bind_loopback()

    def _bind_loopback(self) -> None:
        # Loopback unless the user chose an address.
        opts = ctx.options
        if "listen_host" in opts and opts.listen_host == "":
            opts.listen_host = "127.0.0.1"
            self._loopback_forced = True

    def _rebind_loopback(self) -> None:
        # mitmdump loads -s scripts concurrently with starting its servers, and a listen_host change alone does not
        # restart them: pin each mode without its own address to 127.0.0.1, which restarts it there.
        from mitmproxy.proxy import mode_specs

        modes, changed = [], False
        for text in ctx.options.mode:
            spec = mode_specs.ProxyMode.parse(text)
            port = spec.listen_port(ctx.options.listen_port)
            if spec.custom_listen_host is None and port is not None:
                text = f"{spec.type_name}{':' + spec.data if spec.data else ''}@127.0.0.1:{port}"
                changed = True
            modes.append(text)
        if changed:
            ctx.options.mode = modes

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        # Eager connections would dial the real provider on every CONNECT; h2 costs ~2.3x CPU (FIELD-NOTES §2).
        if "connection_strategy" in opts and opts.connection_strategy != "lazy":
            opts.connection_strategy = "lazy"
        if "http2" in opts and opts.http2:
            opts.http2 = False
        if "listen_host" in updated:
            self._bind_loopback()
        if "polar_hosts" in updated:
            parsed = hostlist.parse_hosts(opts.polar_hosts)
            if not parsed:
                raise exceptions.OptionsError("polar_hosts must name at least one host")
            self.hosts = parsed
        if "polar_backend" in updated and opts.polar_backend not in ("auto", "vllm", "sglang"):
            raise exceptions.OptionsError("polar_backend must be auto, vllm or sglang")
        if "polar_logprobs_mode" in updated and opts.polar_logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise exceptions.OptionsError("polar_logprobs_mode must be raw_logprobs or processed_logprobs")
        if "polar_upstream" in updated and not opts.polar_upstream.rstrip("/").endswith("/v1"):
            raise exceptions.OptionsError("polar_upstream must be an OpenAI base URL ending in /v1")
        num = {name: _number(opts, name) for name in NUMBER_OPTIONS}
        if opts.polar_exact:
            try:
                cache_mb = float(opts.polar_exact_cache_mb)
            except ValueError:
                raise exceptions.OptionsError("polar_exact_cache_mb must be a number") from None
            if self.exact is None or "polar_exact_cache_mb" in updated:
                self.exact = ExactMode(TurnCache(max_bytes=int(cache_mb * 1024 * 1024)))
        else:
            self.exact = None
        try:
            override = parse_sampling_override(opts.polar_sampling_override)
        except ValueError as exc:
            raise exceptions.OptionsError(f"polar_sampling_override: {exc}") from exc
        self.settings = CallSettings(
            max_body_bytes=int(num["polar_max_body_mb"] * 1024 * 1024),
            connect_timeout=num["polar_connect_timeout"],
            first_byte_timeout=num["polar_first_byte_timeout"],
            idle_timeout=num["polar_idle_timeout"],
            logprobs_mode=opts.polar_logprobs_mode,
            thinking_kwarg=opts.polar_thinking_kwarg,
            sampling_override=override,
            exact=self.exact,
        )
        if updated & {"polar_flows", "polar_rotate_mb", "polar_min_free_mb"} or self.writer is None:
            if self.writer is not None:
                self.writer.close()
            self.writer = FlowWriter(opts.polar_flows, num["polar_rotate_mb"], num["polar_min_free_mb"])
        if updated & {"polar_upstream", "polar_model", "polar_backend", "polar_upstream_api_key",
                      "polar_connect_timeout"} or self.backend is None:
            old = self.backend
            self.backend = Backend(opts.polar_upstream, opts.polar_model, opts.polar_backend,
                                   opts.polar_upstream_api_key, num["polar_connect_timeout"])
            # The streamed chat call goes through a lean HTTP/1.1 client on plain-http backends (httpx costs ~10x
            # its CPU per streamed call, BENCHMARKS.md); /models, /version and /tokenize stay on httpx.
            if self.backend.base_url.startswith("http://"):
                self.backend.stream_client = StreamClient(self.backend.base_url, self.backend.headers,
                                                          num["polar_connect_timeout"])
            if old is not None:
                try:
                    asyncio.get_running_loop().create_task(_close_backend(old))
                except RuntimeError:
                    pass  # configured before the event loop runs: nothing was opened yet

    async def running(self) -> None:
        if self._loopback_forced:
            self._rebind_loopback()
        port = await self.endpoint.start()
        log.info("polar gateway endpoint on 127.0.0.1:%d, upstream %s, flows %s", port,
                 ctx.options.polar_upstream, os.path.abspath(ctx.options.polar_flows))

    async def done(self) -> None:
        await self.endpoint.stop()
        if self.backend is not None:
            await _close_backend(self.backend)
        if self.writer is not None:
            self.writer.close()

    # ------------------------------------------------------------------------------------------------ connections

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        host, port = data.context.server.address or (None, None)
        sni = data.client_hello.sni
        if not (hostlist.is_provider(self.hosts, sni, port) or hostlist.is_provider(self.hosts, host, port)):
            data.ignore_connection = True  # tunnelled raw: the client sees the real host's own certificate

    def http_connect(self, flow: http.HTTPFlow) -> None:
        self.conn_users[flow.client_conn.id] = sessions.proxy_user(flow.request.headers.get("proxy-authorization"))

    def client_disconnected(self, client) -> None:
        self.conn_users.pop(client.id, None)

    # ------------------------------------------------------------------------------------------------ flows

    def request(self, flow: http.HTTPFlow) -> None:
        try:
            self._reroute(flow)
        except Exception as exc:  # noqa: BLE001 — a raising hook would send the flow to the real provider
            log.exception("polar: failed to reroute %s", flow.request.pretty_url)
            self.pending.pop(flow.id, None)
            self._fail_closed(flow, f"gateway error: {exc}")

    def _fail_closed(self, flow: http.HTTPFlow, message: str) -> None:
        body = orjson.dumps({"error": {"type": "overloaded_error", "message": message, "code": 503}})
        flow.response = http.Response.make(503, body, {"content-type": "application/json"})

    def _is_provider_flow(self, flow: http.HTTPFlow) -> bool:
        req = flow.request
        if hostlist.is_provider(self.hosts, req.pretty_host, req.port):
            return True
        addr = flow.server_conn.address
        return bool(addr) and hostlist.is_provider(self.hosts, addr[0], addr[1])

    def _reroute(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        req = flow.request
        if req.pretty_host == READY_HOST and not req.scheme == "https":
            ready = self.endpoint.port is not None
            body = orjson.dumps({"ready": ready, "upstream": ctx.options.polar_upstream,
                                 "flows": os.path.abspath(ctx.options.polar_flows), "pid": os.getpid()})
            flow.response = http.Response.make(200 if ready else 503, body, {"content-type": "application/json"})
            return
        if not self._is_provider_flow(flow):
            return
        if self.endpoint.port is None:
            self._fail_closed(flow, "polar gateway endpoint is not running yet")
            return
        conn_user = self.conn_users.get(flow.client_conn.id)
        if conn_user is None:
            conn_user = sessions.proxy_user(req.headers.get("proxy-authorization"))  # plain-HTTP proxy requests
        path, _ = strip_key_param(req.path)
        pending = PendingCall(
            record_id=uuid7(), conn_id=flow.client_conn.id, host=req.pretty_host.lower(), port=req.port,
            method=req.method, path=path, raw_path=req.path, headers=list(req.headers.items(multi=True)),
            body=req.get_content(strict=False) or b"", content_encoding=req.headers.get("content-encoding"),
            conn_user=conn_user, t_start=time.time(),
        )
        try:
            pending.body = req.get_content(strict=True) or b""
        except ValueError:
            pending.decode_error = f"cannot decode content-encoding {req.headers.get('content-encoding')!r}"
        self.pending[flow.id] = pending
        flow.metadata["polar_rerouted"] = True
        # Same process, so the call travels as a token: no agent header or secret is sent over the hop.
        req.scheme = "http"
        req.host = "127.0.0.1"
        req.port = self.endpoint.port
        req.path = f"/polar/{flow.id}"
        req.method = "POST"
        req.headers.clear()
        req.headers["host"] = f"127.0.0.1:{self.endpoint.port}"
        req.content = b""

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get("polar_rerouted"):
            flow.response.stream = True

    def error(self, flow: http.HTTPFlow) -> None:
        self.pending.pop(flow.id, None)

    def response(self, flow: http.HTTPFlow) -> None:
        self.pending.pop(flow.id, None)

    # ------------------------------------------------------------------------------------------------ endpoint

    async def _serve(self, method: str, target: str, headers, body: bytes, responder: Responder) -> None:
        flow_id = target.rpartition("/")[2]
        pending = self.pending.pop(flow_id, None)
        if pending is None or self.settings is None or self.backend is None or self.writer is None:
            await responder.respond(404, [("content-type", "application/json")],
                                    b'{"error":{"message":"unknown polar call","type":"not_found"}}')
            return
        await handle_call(pending, responder, self.settings, self.backend, self.writer)
