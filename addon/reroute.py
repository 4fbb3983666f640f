"""The request-hook fallback, for provider flows that were not diverted (polar_divert=false, plain-HTTP proxy
requests, other proxy modes, a gateway failing closed, an endpoint not started yet): reroute the flow to the
endpoint, or answer in the provider's "unavailable" shape; never let it reach the real host. The call travels as a
token (`/polar/<flow id>`, same process): no agent header or secret is sent over the hop. `responseheaders` relays
our bytes as they come. A base-URL request that was not diverted (addon/base_url.py) is rerouted the same way, or
answered with its protocol's refusal."""

from __future__ import annotations

from mitmproxy import http

import logging

from . import base_url
from . import pending as pending_calls
from .connections import is_provider_flow
from .gateway import ENDPOINT_HOST, GatewayAddon, fail_closed, request_hook

log = logging.getLogger("polar.gateway")


class Reroute(GatewayAddon):
    @request_hook
    def request(self, flow: http.HTTPFlow) -> None:
        self._reroute(flow)

    def _reroute(self, flow: http.HTTPFlow) -> None:
        g = self.gateway
        if flow.response is not None:
            return
        listen_port = base_url.own_address_port(flow, flow.client_conn.id in g.conn_users,
                                                 flow.client_conn.id in g.origin_form_conns)
        if listen_port is not None:
            self._base_url(flow, listen_port)
            return
        if not is_provider_flow(g.hosts, flow):
            return
        if g.failure is not None:
            fail_closed(flow, f"polar gateway is misconfigured ({g.failure}); see the proxy log")
            return
        port = g.endpoint.port
        if port is None:
            fail_closed(flow, "polar gateway endpoint is not running yet")
            return
        self._to_endpoint(flow, pending_calls.from_flow(flow, g.conn_users.get(flow.client_conn.id)))

    def _base_url(self, flow: http.HTTPFlow, listen_port: int) -> None:
        g, req = self.gateway, flow.request
        if g.failure is not None or g.endpoint.port is None or g.options is None:
            why = f"misconfigured ({g.failure}); see the proxy log" if g.failure else "not running yet"
            self._refuse(flow, base_url.BaseUrlRefused("unavailable", f"the gateway is {why}"))
            return
        if not base_url.enabled(g.options.base_url, base_url.listen_host()):
            self._refuse(flow, base_url.BaseUrlRefused(
                "forbidden", "base-URL mode is off (polar_base_url=off, or a non-loopback listen host without "
                             "polar_base_url=on): point the agent at the proxy instead (HTTPS_PROXY)"))
            return
        try:
            pending = pending_calls.from_base_url(
                conn_id=flow.client_conn.id, listen_port=listen_port, method=req.method, target=req.path,
                headers=list(req.headers.items(multi=True)), body=req.raw_content or b"",
                content_encoding=req.headers.get("content-encoding"), conn_user=g.conn_users.get(flow.client_conn.id))
        except base_url.BaseUrlRefused as exc:
            g.control.served["base_url_refused"] += 1
            log.warning("polar: base-URL request %s %s refused: %s", req.method, req.path[:200], exc)
            self._refuse(flow, exc)
            return
        self._to_endpoint(flow, pending)

    @staticmethod
    def _refuse(flow: http.HTTPFlow, exc) -> None:
        status, content_type, body = base_url.refusal_answer(exc)
        flow.response = http.Response.make(status, body, {"content-type": content_type})

    def _to_endpoint(self, flow: http.HTTPFlow, pending) -> None:
        g = self.gateway
        port = g.endpoint.port
        g.pending[flow.id] = pending
        flow.metadata["polar_rerouted"] = True
        req = flow.request
        req.scheme = "http"
        req.host = ENDPOINT_HOST
        req.port = port
        req.path = f"/polar/{flow.id}"
        req.method = "POST"
        req.headers.clear()
        req.headers["host"] = f"{ENDPOINT_HOST}:{port}"
        req.content = b""

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get("polar_rerouted"):
            flow.response.stream = True

    def error(self, flow: http.HTTPFlow) -> None:
        self.gateway.pending.pop(flow.id, None)

    def response(self, flow: http.HTTPFlow) -> None:
        self.gateway.pending.pop(flow.id, None)
