"""The Polar gateway as mitmproxy addons: decrypt provider hosts only, answer their calls from the gateway endpoint.

mitmproxy's own practice, one concern per addon: `gateway_addons()` is the list `addon/polar_addon.py` hands
mitmdump (as `mitmproxy.addons.default_addons()` is mitmproxy's), every addon sharing one `Gateway` — the state the
concerns meet in — and defining only the hooks it needs (mitmproxy calls every hook on every addon). In list order:

  Configuration  the polar_* options: declared, parsed together, applied by their parts (the control token, the
                 flow writer, the backend); a bad one fails closed
  ProxyOptions   mitmproxy's own options as the gateway needs them: lazy connections, no HTTP/2, a private confdir
  Loopback       listen on 127.0.0.1 unless an address was chosen (and rebind the servers mitmdump already started)
  Servers        the endpoint every call is answered on and the control (hold/release) server, on loopback ports
  Backends       the replica pool (one backend client per replica), replaced when its options change
  FlowFiles      the flow writer
  TlsFilter      tls_clienthello: decrypt providers only, tunnel everything else raw
  Sessions       http_connect: the proxy credentials name the session; TLS failures per session
  Readiness      request: `http://polar.gateway/ready`, the probe of scripts/proxy (before Refuse: it is answered)
  Refuse         polar_other_hosts=refuse: 403 for a CONNECT or a plain-HTTP request outside the provider hosts
  Divert         next_layer: a provider tunnel goes below mitmproxy's HTTP layer, its decrypted bytes relayed to the
                 endpoint (no HTTP flow, no per-call hooks)
  Hops           server_connected: tell the endpoint which agent connection each hop to it carries
  Reroute        request: the fallback for what is not diverted (polar_divert=false, plain-HTTP proxy requests,
                 other proxy modes, a gateway failing closed, an endpoint not started yet) — reroute a provider flow
                 to the endpoint or answer 503, never let it reach the real host

Either way the endpoint answers each call through `call.handle_call` (`Gateway._serve`). The list itself is
`addons.gateway_addons()`, a floor above the addons, which import this module for the state they share.
"""

from __future__ import annotations

import functools
import logging

from mitmproxy import ctx, http

from polar.records import FlowWriter

from . import base_url
from . import hosts as hostlist
from . import pending as pending_calls
from .call import CallSettings, PendingCall, handle_call
from .control import Control, ControlServer
from .endpoint import Endpoint, Request, Responder
from .exact import ExactMode
from .options import GatewayOptions
from .pool import Pool
from .provider_errors import unavailable

log = logging.getLogger("polar.gateway")

READY_HOST = "polar.gateway"  # `curl -x <proxy> http://polar.gateway/ready` — the readiness probe of scripts/proxy
READY_PATH = "/ready"
ENDPOINT_HOST = "127.0.0.1"


class Gateway:
    """What the addons share: the parsed options and what they configured, the endpoint, the calls and connections
    in progress, and the counters the readiness answer shows. Each field has one addon that writes it."""

    def __init__(self) -> None:
        self.hosts = hostlist.parse_hosts(hostlist.DEFAULT_HOSTS)  # Configuration
        self.options: GatewayOptions | None = None  # Configuration: the options applied last
        # Configuration: the one line of the current configuration error; while it is set the gateway fails closed.
        self.failure: str | None = None
        self.started = False  # Servers: mitmproxy ran the `running` hooks (start-up is over)
        self.settings: CallSettings | None = None  # Configuration
        self.exact: ExactMode | None = None  # Configuration
        self.writer: FlowWriter | None = None  # FlowFiles
        self.pool: Pool | None = None  # Backends: every replica of polar_upstream
        # Weight publication (docs/architecture.md#the-trainer-side): hold/release state shared by every call, and
        # its loopback server (Configuration's ControlToken, Servers).
        self.control = Control()
        self.control_server = ControlServer(self.control, None)
        self.control_token_path: str | None = None
        self.endpoint = Endpoint(self._serve, body_cap=self._body_cap)  # Servers
        self.conn_users: dict[str, str | None] = {}  # Sessions: proxy user per agent connection
        # Client TLS handshakes that failed, per proxy user (an agent that does not trust our CA): readiness shows
        # them so a rollout's preflight can say which sample could not connect. Bounded. (Sessions)
        self.tls_failures: dict[str, int] = {}
        self.refused = 0  # Refuse: requests polar_other_hosts=refuse answered 403
        # Divert: diverted tunnels by agent connection id: (id of the hop's server connection, CONNECT host, port).
        self.tunnels: dict[str, tuple[str, str, int]] = {}
        # Divert: base-URL connections by agent connection id: (id of the hop's server connection, listen port).
        self.base_url_conns: dict[str, tuple[str, int]] = {}
        # client connections whose first request was origin-form (a base-URL client, whether diverted or not)
        self.origin_form_conns: set[str] = set()
        self.pending: dict[str, PendingCall] = {}  # Reroute: rerouted flows by flow id, until the endpoint takes them
        self.served = self.control.served  # calls per path (/admin/state and the readiness answer show them)

    def refuses_others(self) -> bool:
        """polar_other_hosts: anything but a valid `tunnel` refuses (a bad value fails closed here too)."""
        if self.options is not None and self.failure is None:
            return self.options.other_hosts != "tunnel"
        return str(getattr(ctx.options, "polar_other_hosts", "tunnel")) != "tunnel"

    # ------------------------------------------------------------------------------------------------ the endpoint

    def _body_cap(self) -> int | None:
        return self.settings.max_body_bytes if self.settings is not None else None

    async def _serve(self, request: Request, responder: Responder) -> None:
        """The endpoint's answer to each request on a handed connection."""
        if request.handoff.diverted:
            await self._serve_diverted(request, responder)
            return
        if request.handoff.base_url:
            await self._serve_base_url(request, responder)
            return
        flow_id = request.target.rpartition("/")[2]  # a rerouted flow: the call travels as a token
        pending = self.pending.pop(flow_id, None)
        if pending is None or self.settings is None or self.pool is None or self.writer is None:
            await responder.respond(404, [("content-type", "application/json")],
                                    b'{"error":{"message":"unknown polar call","type":"not_found"}}')
            return
        self.served["base_url" if pending.connect == "base_url" else "rerouted"] += 1
        await handle_call(pending, responder, self.settings, self.pool, self.writer)

    async def _serve_diverted(self, request: Request, responder: Responder) -> None:
        """The agent's own request from a diverted tunnel: the PendingCall the request hook would have built."""
        h = request.handoff
        try:
            pending = pending_calls.from_request(request)
        except Exception as exc:  # noqa: BLE001 — like a raising request hook: answered 503, never forwarded
            log.exception("polar: failed to serve %s %s on %s", request.method, request.target[:200], h.host)
            await answer_unavailable(responder, h.host, request.target, f"gateway error: {exc}")
            return
        if self.failure is not None:  # options went bad after the tunnel was diverted
            await answer_unavailable(responder, pending.host, pending.path,
                                     f"polar gateway is misconfigured ({self.failure}); see the proxy log")
            return
        if self.settings is None or self.pool is None or self.writer is None:
            await answer_unavailable(responder, pending.host, pending.path, "polar gateway is not configured")
            return
        self.served["diverted"] += 1
        await handle_call(pending, responder, self.settings, self.pool, self.writer)


    async def _serve_base_url(self, request: Request, responder: Responder) -> None:
        """A request on a base-URL connection: admitted (this machine only), mapped to its provider host, served."""
        try:
            pending = pending_calls.from_base_url_request(request)
        except base_url.BaseUrlRefused as exc:
            self.served["base_url_refused"] += 1
            log.warning("polar: base-URL request %s %s refused: %s", request.method, request.target[:200], exc)
            status, content_type, body = base_url.refusal_answer(exc)
            await responder.respond(status, [("content-type", content_type)], body)
            return
        except Exception as exc:  # noqa: BLE001 — answered 503, never forwarded
            log.exception("polar: failed to serve %s %s on a base-URL connection", request.method,
                          request.target[:200])
            await answer_unavailable(responder, None, request.target, f"gateway error: {exc}")
            return
        if self.failure is not None or self.settings is None or self.pool is None or self.writer is None:
            await answer_unavailable(responder, pending.host, pending.path,
                                     f"polar gateway is not serving ({self.failure or 'not configured'})")
            return
        self.served["base_url"] += 1
        await handle_call(pending, responder, self.settings, self.pool, self.writer)


class GatewayAddon:
    """One concern of the gateway, on the shared `Gateway`. Its mitmproxy name is `polar.<class name>`, clear of
    other scripts' addons (a clash would stop the whole list from loading)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.name = f"polar.{cls.__name__.lower()}"

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway


async def answer_unavailable(responder: Responder, host: str | None, path: str, message: str) -> None:
    status, content_type, body = unavailable(hostlist.protocol_for(host, path), message)
    await responder.respond(status, [("content-type", content_type)], body)


def fail_closed(flow: http.HTTPFlow, message: str) -> None:
    """Answer in the provider's own "unavailable" shape; the flow never leaves the proxy."""
    status, content_type, body = unavailable(hostlist.protocol_for(flow.request.pretty_host, flow.request.path),
                                             message)
    flow.response = http.Response.make(status, body, {"content-type": content_type})


def request_hook(method):
    """A `request` hook that fails closed: a raising hook would send the flow on to the real provider (mitmproxy
    logs the error and goes on), so a failure is answered here in the provider's shape."""

    @functools.wraps(method)
    def hook(self, flow: http.HTTPFlow) -> None:
        try:
            method(self, flow)
        except Exception as exc:  # noqa: BLE001
            log.exception("polar: failed to reroute %s", flow.request.pretty_url)
            self.gateway.pending.pop(flow.id, None)
            fail_closed(flow, f"gateway error: {exc}")

    return hook
