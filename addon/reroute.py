"""The request-hook fallback, for provider flows that were not diverted (polar_divert=false, plain-HTTP proxy
requests, other proxy modes, a gateway failing closed, an endpoint not started yet): reroute the flow to the
endpoint, or answer in the provider's "unavailable" shape; never let it reach the real host. The call travels as a
token (`/polar/<flow id>`, same process): no agent header or secret is sent over the hop. `responseheaders` relays
our bytes as they come."""

from __future__ import annotations

from mitmproxy import http

from . import pending as pending_calls
from .connections import is_provider_flow
from .gateway import ENDPOINT_HOST, GatewayAddon, fail_closed, request_hook


class Reroute(GatewayAddon):
    @request_hook
    def request(self, flow: http.HTTPFlow) -> None:
        self._reroute(flow)

    def _reroute(self, flow: http.HTTPFlow) -> None:
        g = self.gateway
        if flow.response is not None or not is_provider_flow(g.hosts, flow):
            return
        if g.failure is not None:
            fail_closed(flow, f"polar gateway is misconfigured ({g.failure}); see the proxy log")
            return
        port = g.endpoint.port
        if port is None:
            fail_closed(flow, "polar gateway endpoint is not running yet")
            return
        g.pending[flow.id] = pending_calls.from_flow(flow, g.conn_users.get(flow.client_conn.id))
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
