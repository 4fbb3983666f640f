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

import orjson
from mitmproxy import ctx, http, tls

from . import hosts as hostlist
from . import sessions
from .backend import Backend
from .call import CallSettings, PendingCall, handle_call, strip_key_param
from .endpoint import Endpoint, Responder
from .exact import ExactMode, TurnCache
from .record import FlowWriter, uuid7
from .options import BY_NAME, OPTIONS, GatewayOptions, OptionError, parse_options, take_unparseable
from .provider_errors import unavailable
from .confdir import secure_confdir
from .upstream import StreamClient

log = logging.getLogger("polar.gateway")


async def _close_backend(backend: Backend) -> None:
    stream_client = getattr(backend, "stream_client", None)
    if stream_client is not None:
        await stream_client.aclose()
    await backend.close()

READY_HOST = "polar.gateway"  # `curl -x <proxy> http://polar.gateway/ready` — the readiness probe of scripts/proxy


class PolarGateway:
    def __init__(self) -> None:
        self.hosts = hostlist.parse_hosts(hostlist.DEFAULT_HOSTS)
        self.conn_users: dict[str, str | None] = {}
        self.pending: dict[str, PendingCall] = {}
        self.endpoint = Endpoint(self._serve)
        self.writer: FlowWriter | None = None
        self.backend: Backend | None = None
        self.settings: CallSettings | None = None
        self.options: GatewayOptions | None = None
        self._loopback_forced = False
        self.exact: ExactMode | None = None
        # Values mitmproxy could not parse (taken out of its deferred set in `load`), and the one line of the
        # current configuration error: while it is set the gateway fails closed (providers get their 503).
        self._unparseable: dict[str, OptionError] = {}
        self.failure: str | None = None

    # ------------------------------------------------------------------------------------------------ options

    def load(self, loader) -> None:
        for option in OPTIONS:
            loader.add_option(option.name, option.typespec, option.default, option.help)
        self._unparseable = take_unparseable(loader.master.options, BY_NAME)
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
        # Parse everything before changing anything: a failure must leave no half-applied state behind, and setting
        # mitmproxy's own options below re-enters configure (raising there made mitmproxy roll back and re-run it
        # without end, issue 13).
        try:
            parsed = self._parse_options()
            self._apply(parsed, updated)
        except (OptionError, OSError) as exc:
            self._fail(str(exc) if isinstance(exc, OptionError) else f"polar_flows: {exc}")
        else:
            if self.failure is not None:
                log.info("polar gateway: options valid again, serving")
            self.failure = None
        self._enforce_proxy_options(updated)

    def _parse_options(self) -> GatewayOptions:
        if self._unparseable:  # never applied, so it stays an error until the proxy is restarted
            raise next(iter(self._unparseable.values()))
        return parse_options({name: getattr(ctx.options, name) for name in BY_NAME})

    def _fail(self, line: str) -> None:
        # One error line (mitmdump exits on errors logged at startup; later, the proxy keeps answering 503).
        if line != self.failure:
            log.error("polar gateway: %s; failing closed (provider requests get 503)", line)
        self.failure = line
        self.hosts = hostlist.fail_closed_hosts(getattr(ctx.options, "polar_hosts", ()))

    def _enforce_proxy_options(self, updated: set[str]) -> None:
        opts = ctx.options
        # Eager connections would dial the real provider on every CONNECT; h2 costs ~2.3x CPU (FIELD-NOTES §2).
        if "connection_strategy" in opts and opts.connection_strategy != "lazy":
            opts.connection_strategy = "lazy"
        if "http2" in opts and opts.http2:
            opts.http2 = False
        if "listen_host" in updated:
            self._bind_loopback()
        if "confdir" in opts and (updated & {"confdir"} or self.options is None):
            for change in secure_confdir(opts.confdir):
                log.warning("polar gateway: %s (the CA key must stay private)", change)

    def _apply(self, o: GatewayOptions, updated: set[str]) -> None:
        if o.exact:
            if self.exact is None or self.options is None or o.exact_cache_bytes != self.options.exact_cache_bytes:
                self.exact = ExactMode(TurnCache(max_bytes=o.exact_cache_bytes))
        else:
            self.exact = None
        old = self.options
        if old is None or self.writer is None or (o.flows, o.rotate_mb, o.min_free_mb) != (
                old.flows, old.rotate_mb, old.min_free_mb):
            writer = FlowWriter(o.flows, o.rotate_mb, o.min_free_mb)  # OSError: the directory cannot be made
            if self.writer is not None:
                self.writer.close()
            self.writer = writer
        self.hosts = o.hosts
        self.settings = CallSettings(
            max_body_bytes=o.max_body_bytes, connect_timeout=o.connect_timeout,
            first_byte_timeout=o.first_byte_timeout, idle_timeout=o.idle_timeout, logprobs_mode=o.logprobs_mode,
            thinking_kwarg=o.thinking_kwarg, sampling_override=o.sampling_override, exact=self.exact,
        )
        if self.backend is None or old is None or (o.upstream, o.model, o.backend, o.upstream_api_key,
                                                   o.connect_timeout) != (old.upstream, old.model, old.backend,
                                                                          old.upstream_api_key, old.connect_timeout):
            self._replace_backend(o)
        self.options = o

    def _replace_backend(self, o: GatewayOptions) -> None:
        old = self.backend
        self.backend = Backend(o.upstream, o.model, o.backend, o.upstream_api_key, o.connect_timeout)
        # The streamed chat call goes through a lean HTTP/1.1 client on plain-http backends (httpx costs ~10x
        # its CPU per streamed call, BENCHMARKS.md); /models, /version and /tokenize stay on httpx.
        if self.backend.base_url.startswith("http://"):
            self.backend.stream_client = StreamClient(self.backend.base_url, self.backend.headers,
                                                      o.connect_timeout)
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
        """Answer in the provider's own "unavailable" shape; the flow never leaves the proxy."""
        status, content_type, body = unavailable(hostlist.protocol_for(flow.request.pretty_host, flow.request.path),
                                                 message)
        flow.response = http.Response.make(status, body, {"content-type": content_type})

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
            self._answer_ready(flow)
            return
        if not self._is_provider_flow(flow):
            return
        if self.failure is not None:
            self._fail_closed(flow, f"polar gateway is misconfigured ({self.failure}); see the proxy log")
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

    def _answer_ready(self, flow: http.HTTPFlow) -> None:
        # Not ready yet (endpoint starting) means "wait"; an `error` means this proxy fails closed: stop waiting.
        ready = self.endpoint.port is not None and self.failure is None
        info: dict = {"ready": ready, "upstream": ctx.options.polar_upstream,
                      "flows": os.path.abspath(ctx.options.polar_flows), "pid": os.getpid()}
        if self.failure is not None:
            info.update(error=f"polar gateway: {self.failure}", fail_closed=True)
        flow.response = http.Response.make(200 if ready else 503, orjson.dumps(info),
                                           {"content-type": "application/json"})

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
