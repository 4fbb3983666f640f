"""`http://polar.gateway/ready` through the proxy (plain HTTP): the readiness probe of scripts/proxy and of a
rollout's preflight. Not ready yet (the endpoint starting) means "wait"; an `error` means this proxy fails closed:
stop waiting. Under polar_other_hosts=refuse this path is the only plain-HTTP request answered."""

from __future__ import annotations

import os

import orjson
from mitmproxy import ctx, http

from .gateway import READY_HOST, READY_PATH, GatewayAddon, request_hook


def _package_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("polar-gateway")
    except Exception:  # noqa: BLE001 — not installed as a distribution (a bare checkout): unknown
        return None


class Readiness(GatewayAddon):
    @request_hook
    def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if flow.response is not None or req.pretty_host != READY_HOST or req.scheme == "https":
            return
        if not self.gateway.refuses_others() or req.path.split("?", 1)[0] == READY_PATH:
            self._answer(flow)

    def _answer(self, flow: http.HTTPFlow) -> None:
        g = self.gateway
        ready = g.endpoint.port is not None and g.failure is None
        if g.refuses_others() and "proxy-authorization" in flow.request.headers:
            # An agent's probe (sandboxed clients always carry their session): whether to wait, nothing more — the
            # backend, the flow directory and the other samples' counters are the operator's business.
            flow.response = http.Response.make(200 if ready else 503, orjson.dumps({"ready": ready}),
                                               {"content-type": "application/json"})
            return
        info: dict = {"ready": ready, "upstream": ctx.options.polar_upstream,
                      "flows": os.path.abspath(ctx.options.polar_flows), "pid": os.getpid()}
        if g.failure is not None:
            info.update(error=f"polar gateway: {g.failure}", fail_closed=True)
        info["served"] = dict(g.served)
        o = g.options
        info.update(other_hosts="refuse" if g.refuses_others() else "tunnel",
                    exact=bool(o.exact) if o is not None else False, version=_package_version(),
                    tls_failures=dict(g.tls_failures), refused=g.refused,
                    control_url=g.control_server.url, control_token=g.control_token_path,
                    held=g.control.held, weight_version=g.control.weight_version)
        flow.response = http.Response.make(200 if ready else 503, orjson.dumps(info),
                                           {"content-type": "application/json"})
