"""PolarGateway — the mitmproxy addon: decrypt provider hosts only, answer their calls from the gateway endpoint.

Hooks, in the order a connection meets them: http_connect (proxy credentials → session; with
polar_other_hosts=refuse a CONNECT to a host outside polar_hosts gets 403 and no tunnel), next_layer (divert a
provider tunnel below mitmproxy's HTTP layer: mitmproxy terminates TLS and relays the decrypted bytes to our endpoint
on 127.0.0.1, which parses the agent's HTTP itself — no HTTP flow, no per-call hooks), tls_clienthello (decrypt
providers only), server_connected (tell the endpoint which agent connection each hop carries).
Fallback for what is not diverted (polar_divert=false, plain-http proxy requests, other proxy modes, a failing-closed
gateway, an endpoint not started yet): request (reroute a provider flow to our endpoint, or answer 503; never let
it reach the real host; with refuse, every other plain-HTTP request but the readiness probe gets 403) and
responseheaders (relay our bytes as they come). Either way the endpoint answers each
call through `call.handle_call`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import orjson
from mitmproxy import connection, ctx, http, tls
from mitmproxy.net import encoding
from mitmproxy.net.http import url
from mitmproxy.net.tls import starts_like_tls_record
from mitmproxy.proxy import layer
from mitmproxy.proxy.layers import ClientTLSLayer, HttpLayer, TCPLayer, modes
from mitmproxy.proxy.layers.http import HttpStream
from mitmproxy.proxy.layers.tls import parse_client_hello

from polar.records import FlowWriter, uuid7

from . import hosts as hostlist
from . import sessions
from .backend import Backend
from .call import CallSettings, PendingCall, handle_call, strip_key_param
from .endpoint import Endpoint, Handoff, Request, Responder
from .exact import ExactMode, TurnCache
from .options import BY_NAME, OPTIONS, GatewayOptions, OptionError, parse_options, take_unparseable
from .provider_errors import unavailable
from .confdir import secure_confdir
from .control import Control, ControlServer, TokenFileError, ensure_token
from .http_client import StreamClient

log = logging.getLogger("polar.gateway")


async def _close_backend(backend: Backend) -> None:
    if backend.stream_client is not None:
        await backend.stream_client.aclose()
    await backend.close()

READY_HOST = "polar.gateway"  # `curl -x <proxy> http://polar.gateway/ready` — the readiness probe of scripts/proxy
READY_PATH = "/ready"
ENDPOINT_HOST = "127.0.0.1"


def _package_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("polar-gateway")
    except Exception:  # noqa: BLE001 — not installed as a distribution (a bare checkout): unknown
        return None


class PolarGateway:
    def __init__(self) -> None:
        self.hosts = hostlist.parse_hosts(hostlist.DEFAULT_HOSTS)
        self.conn_users: dict[str, str | None] = {}
        self.pending: dict[str, PendingCall] = {}
        # Diverted tunnels by agent connection id: (id of the hop's server connection, CONNECT host, port).
        self.tunnels: dict[str, tuple[str, str, int]] = {}
        self.served = {"diverted": 0, "rerouted": 0}  # calls per path (the readiness answer shows them)
        # Client TLS handshakes that failed, per proxy user (an agent that does not trust our CA): readiness shows
        # them so a rollout's preflight can say which sample could not connect. Bounded.
        self.tls_failures: dict[str, int] = {}
        self.refused = 0  # requests polar_other_hosts=refuse answered 403
        self.endpoint = Endpoint(self._serve, body_cap=self._body_cap)
        self.writer: FlowWriter | None = None
        self.backend: Backend | None = None
        self.settings: CallSettings | None = None
        self.options: GatewayOptions | None = None
        self._loopback_forced = False
        self.exact: ExactMode | None = None
        # Weight publication (DESIGN §10): hold/release state shared by every call, and its loopback server.
        self.control = Control()
        self.control_server = ControlServer(self.control, None)
        self.control_token_path: str | None = None
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
            self._fail(str(exc) if isinstance(exc, (OptionError, TokenFileError)) else f"polar_flows: {exc}")
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
        self._load_control_token(o)  # first: TokenFileError leaves nothing half applied
        self.control.hold_timeout = o.hold_timeout
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
            control=self.control,
        )
        if self.backend is None or old is None or (o.upstream, o.model, o.backend, o.upstream_api_key,
                                                   o.connect_timeout) != (old.upstream, old.model, old.backend,
                                                                          old.upstream_api_key, old.connect_timeout):
            self._replace_backend(o)
        self.options = o

    def _load_control_token(self, o: GatewayOptions) -> None:
        """The control token, read (or created 0600) once per path. The default lives in mitmproxy's confdir, made
        0700 here when it does not exist yet (mitmproxy would create it 0755 later)."""
        if o.control_token is not None:
            path = os.path.abspath(os.path.expanduser(o.control_token))
        else:
            confdir = os.path.expanduser(getattr(ctx.options, "confdir", "~/.mitmproxy"))
            path = os.path.abspath(os.path.join(confdir, "control-token"))
            if not os.path.isdir(confdir):
                try:
                    os.makedirs(confdir, mode=0o700, exist_ok=True)
                except OSError as exc:
                    raise TokenFileError(f"polar_control_token: cannot create {confdir}: {exc}") from None
        if path != self.control_token_path or self.control_server.token is None:
            token = ensure_token(path)
            self.control_server.token = token.encode()
            self.control_token_path = path

    def _replace_backend(self, o: GatewayOptions) -> None:
        old = self.backend
        self.backend = Backend(o.upstream, o.model, o.backend, o.upstream_api_key, o.connect_timeout)
        self.backend.on_weight_version = self.control.adopt_backend_version
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
        # The control port is bound before anything yields, so a proxy that answers ready has its control_url; both
        # servers then start side by side (each start yields to the loop once).
        control_port = self.control_server.bind()
        port, _ = await asyncio.gather(self.endpoint.start(), self.control_server.start())
        log.info("polar gateway endpoint on 127.0.0.1:%d, control on 127.0.0.1:%d, upstream %s, flows %s", port,
                 control_port, ctx.options.polar_upstream, os.path.abspath(ctx.options.polar_flows))

    async def done(self) -> None:
        await self.control_server.stop()
        self.control.close()  # held calls go on (and end) rather than wait for a release that cannot come
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
        req = flow.request
        if self._refuses_others() and not hostlist.is_provider(self.hosts, req.host, req.port):
            self._refuse(flow, f"CONNECT {req.host}:{req.port}")  # no tunnel: mitmproxy answers 403 and closes

    def _refuses_others(self) -> bool:
        """polar_other_hosts: anything but a valid `tunnel` refuses (a bad value fails closed here too)."""
        if self.options is not None and self.failure is None:
            return self.options.other_hosts != "tunnel"
        return str(getattr(ctx.options, "polar_other_hosts", "tunnel")) != "tunnel"

    def _refuse(self, flow: http.HTTPFlow, what: str) -> None:
        self.refused += 1
        flow.response = http.Response.make(
            403, f"polar gateway: {what} refused: polar_other_hosts=refuse serves provider hosts only\n",
            {"content-type": "text/plain; charset=utf-8"})

    def tls_failed_client(self, data: tls.TlsData) -> None:
        user = self.conn_users.get(data.context.client.id) or ""
        if user in self.tls_failures or len(self.tls_failures) < 1000:
            self.tls_failures[user] = self.tls_failures.get(user, 0) + 1

    def client_disconnected(self, client) -> None:
        self.conn_users.pop(client.id, None)
        self.tunnels.pop(client.id, None)

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        # Runs before mitmproxy's own NextLayer addon (mitmdump loads -s scripts first),
        # which leaves a layer set here alone. Not diverted: the built-in stack and the request-hook fallback.
        if nextlayer.layer is not None:
            return
        try:
            self._divert(nextlayer)
        except Exception:  # noqa: BLE001 — not diverted is safe: the HTTP path answers (or fails closed)
            log.exception("polar: could not divert a provider tunnel; serving it through the HTTP path")

    def _divert(self, nextlayer: layer.NextLayer) -> None:
        o, port = self.options, self.endpoint.port
        if o is None or not o.divert or self.failure is not None or port is None:
            return  # off, failing closed (the request hook answers 503) or no endpoint yet
        c = nextlayer.context
        # Only the content of a regular-mode CONNECT tunnel: [HttpProxy, HttpLayer, HttpStream(CONNECT)].
        if not (len(c.layers) == 3 and isinstance(c.layers[0], modes.HttpProxy) and isinstance(c.layers[1], HttpLayer)
                and isinstance(c.layers[2], HttpStream)) or c.client.transport_protocol != "tcp":
            return
        host, tport = c.server.address or (None, None)
        data = nextlayer.data_client()
        if not host or not starts_like_tls_record(data):
            return
        # Exactly tls_clienthello's rule (the CONNECT authority, or the SNI on the CONNECT port); a ClientHello not
        # complete yet leaves an SNI-only match to the HTTP path, which decrypts it as before.
        if not hostlist.is_provider(self.hosts, host, tport):
            try:
                hello = parse_client_hello(data)
            except ValueError:
                return
            if hello is None or not hostlist.is_provider(self.hosts, hello.sni, tport):
                return
        c.client.alpn = b"http/1.1"  # the endpoint speaks HTTP/1.1 only, whatever `http2` says
        tls_layer = ClientTLSLayer(c)  # our CA's certificate for the CONNECT host / SNI; the tls_* hooks still run
        # The relay gets a server connection of its own, to the endpoint: the tunnel's server (the provider) is
        # never connected, and the certificate still names the CONNECT host.
        hop = c.fork()
        hop.server = connection.Server(address=(ENDPOINT_HOST, port))
        tls_layer.child_layer = TCPLayer(hop, ignore=True)  # no TCP flow, no tcp_* hooks
        self.tunnels[c.client.id] = (hop.server.id, host.lower().rstrip("."), tport)
        nextlayer.layer = tls_layer

    def server_connected(self, data) -> None:
        # Before mitmproxy relays a byte over a hop to the endpoint (it awaits this hook), say whose it is.
        server, port = data.server, self.endpoint.port
        if port is None or server.sockname is None or tuple(server.address or ())[:2] != (ENDPOINT_HOST, port):
            return
        tunnel = self.tunnels.get(data.client.id)
        conn_user = self.conn_users.get(data.client.id)
        if tunnel is not None and tunnel[0] == server.id:
            handoff = Handoff(conn_id=data.client.id, conn_user=conn_user, host=tunnel[1], port=tunnel[2])
        else:
            handoff = Handoff(conn_id=data.client.id, conn_user=conn_user)  # a rerouted flow's hop (token calls)
        self.endpoint.hand(server.sockname, handoff)

    def server_disconnected(self, data) -> None:
        if data.server.sockname is not None and self.endpoint.port is not None:
            self.endpoint.release(data.server.sockname)

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
        refuse = self._refuses_others()
        if req.pretty_host == READY_HOST and not req.scheme == "https" and (
                not refuse or req.path.split("?", 1)[0] == READY_PATH):
            self._answer_ready(flow)
            return
        if refuse and (req.scheme != "https" or not self._is_provider_flow(flow)):
            self._refuse(flow, f"{req.method} {req.scheme}://{req.pretty_host}:{req.port}{req.path[:200]}")
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
        if self._refuses_others() and "proxy-authorization" in flow.request.headers:
            # An agent's probe (sandboxed clients always carry their session): whether to wait, nothing more — the
            # backend, the flow directory and the other samples' counters are the operator's business.
            flow.response = http.Response.make(200 if ready else 503, orjson.dumps({"ready": ready}),
                                               {"content-type": "application/json"})
            return
        info: dict = {"ready": ready, "upstream": ctx.options.polar_upstream,
                      "flows": os.path.abspath(ctx.options.polar_flows), "pid": os.getpid()}
        if self.failure is not None:
            info.update(error=f"polar gateway: {self.failure}", fail_closed=True)
        info["served"] = dict(self.served)
        o = self.options
        info.update(other_hosts="refuse" if self._refuses_others() else "tunnel",
                    exact=bool(o.exact) if o is not None else False, version=_package_version(),
                    tls_failures=dict(self.tls_failures), refused=self.refused,
                    control_url=self.control_server.url, control_token=self.control_token_path,
                    held=self.control.held, weight_version=self.control.weight_version)
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

    def _body_cap(self) -> int | None:
        return self.settings.max_body_bytes if self.settings is not None else None

    async def _serve(self, request: Request, responder: Responder) -> None:
        if request.handoff.diverted:
            await self._serve_diverted(request, responder)
            return
        flow_id = request.target.rpartition("/")[2]  # a rerouted flow: the call travels as a token
        pending = self.pending.pop(flow_id, None)
        if pending is None or self.settings is None or self.backend is None or self.writer is None:
            await responder.respond(404, [("content-type", "application/json")],
                                    b'{"error":{"message":"unknown polar call","type":"not_found"}}')
            return
        self.served["rerouted"] += 1
        await handle_call(pending, responder, self.settings, self.backend, self.writer)

    async def _serve_diverted(self, request: Request, responder: Responder) -> None:
        """The agent's own request from a diverted tunnel: the PendingCall the request hook would have built."""
        h = request.handoff
        try:
            pending = self._pending_from(request)
        except Exception as exc:  # noqa: BLE001 — like a raising request hook: answered 503, never forwarded
            log.exception("polar: failed to serve %s %s on %s", request.method, request.target[:200], h.host)
            await self._answer_unavailable(responder, h.host, request.target, f"gateway error: {exc}")
            return
        if self.failure is not None:  # options went bad after the tunnel was diverted
            await self._answer_unavailable(responder, pending.host, pending.path,
                                           f"polar gateway is misconfigured ({self.failure}); see the proxy log")
            return
        if self.settings is None or self.backend is None or self.writer is None:
            await self._answer_unavailable(responder, pending.host, pending.path, "polar gateway is not configured")
            return
        self.served["diverted"] += 1
        await handle_call(pending, responder, self.settings, self.backend, self.writer)

    @staticmethod
    async def _answer_unavailable(responder: Responder, host: str | None, path: str, message: str) -> None:
        status, content_type, body = unavailable(hostlist.protocol_for(host, path), message)
        await responder.respond(status, [("content-type", content_type)], body)

    def _pending_from(self, request: Request) -> PendingCall:
        """What `_reroute` takes from mitmproxy's parsed request, taken from the raw one: headers as sent (minus an
        `Expect: 100-continue` the endpoint answered, as mitmproxy drops it), host from the Host header (else the
        CONNECT host) and the CONNECT port, path without `key=`, body decoded per Content-Encoding."""
        h = request.handoff
        headers: list[tuple[str, str]] = []
        host_header = proxy_auth = None
        encodings: list[str] = []
        for raw_name, raw_value in request.headers:  # one pass: the call's only per-header work on this path
            name, value = raw_name.decode("utf-8", "surrogateescape"), raw_value.decode("utf-8", "surrogateescape")
            lower = name.lower()
            if lower == "expect" and value.lower() == "100-continue":
                continue
            if lower == "host" and host_header is None:
                host_header = value
            elif lower == "content-encoding":
                encodings.append(value)
            elif lower == "proxy-authorization" and proxy_auth is None:
                proxy_auth = value
            headers.append((name, value))
        host = url.parse_authority(host_header, check=False)[0] if host_header else h.host
        raw_path = request.target
        if not raw_path.startswith("/") and "://" in raw_path:  # absolute-form inside the tunnel
            rest = raw_path.split("://", 1)[1]
            raw_path = "/" + rest.split("/", 1)[1] if "/" in rest else "/"
        path, _ = strip_key_param(raw_path)
        conn_user = h.conn_user if h.conn_user is not None else sessions.proxy_user(proxy_auth)
        content_encoding = ", ".join(encodings) if encodings else None
        pending = PendingCall(
            record_id=uuid7(), conn_id=h.conn_id, host=host.lower(), port=h.port, method=request.method,
            path=path, raw_path=raw_path, headers=headers, body=request.body, content_encoding=content_encoding,
            conn_user=conn_user, t_start=time.time(),
        )
        if content_encoding and not request.too_large:  # too large: refused on its size before any decoding
            try:
                decoded = encoding.decode(request.body, content_encoding)
                if isinstance(decoded, str):
                    raise ValueError(f"Invalid Content-Encoding: {content_encoding}")
                pending.body = decoded or b""
            except ValueError:
                pending.decode_error = f"cannot decode content-encoding {content_encoding!r}"
        return pending
