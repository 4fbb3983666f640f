"""Who may connect, and what gets decrypted: one addon per concern.

- `TlsFilter`: decrypt provider hosts only; anything else is tunnelled raw (the client sees the real host's own
  certificate).
- `Sessions`: the proxy credentials of each CONNECT name the session of every call on that connection; client TLS
  handshakes that failed are counted per session (an agent that does not trust our CA).
- `Refuse`: polar_other_hosts=refuse serves provider hosts only — a CONNECT to any other host gets 403 and no
  tunnel, and so does every plain-HTTP request but the readiness probe and base-URL requests to the gateway's own
  address (sandboxed rollouts).
"""

from __future__ import annotations

from mitmproxy import http, tls

from . import base_url
from . import hosts as hostlist
from . import sessions
from .gateway import GatewayAddon, request_hook


class TlsFilter(GatewayAddon):
    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        hosts = self.gateway.hosts
        host, port = data.context.server.address or (None, None)
        sni = data.client_hello.sni
        if not (hostlist.is_provider(hosts, sni, port) or hostlist.is_provider(hosts, host, port)):
            data.ignore_connection = True


class Sessions(GatewayAddon):
    def http_connect(self, flow: http.HTTPFlow) -> None:
        user = sessions.proxy_user(flow.request.headers.get("proxy-authorization"))
        self.gateway.conn_users[flow.client_conn.id] = user

    def tls_failed_client(self, data: tls.TlsData) -> None:
        failures = self.gateway.tls_failures
        user = self.gateway.conn_users.get(data.context.client.id) or ""
        if user in failures or len(failures) < 1000:
            failures[user] = failures.get(user, 0) + 1

    def client_disconnected(self, client) -> None:
        self.gateway.conn_users.pop(client.id, None)


class Refuse(GatewayAddon):
    def http_connect(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if self.gateway.refuses_others() and not hostlist.is_provider(self.gateway.hosts, req.host, req.port):
            self._refuse(flow, f"CONNECT {req.host}:{req.port}")  # no tunnel: mitmproxy answers 403 and closes

    @request_hook
    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or not self.gateway.refuses_others():
            return
        g = self.gateway
        if base_url.own_address_port(flow, flow.client_conn.id in g.conn_users,
                                     flow.client_conn.id in g.origin_form_conns) is not None:
            return  # addressed to the gateway itself (base-URL mode): Reroute serves it or says why not
        req = flow.request  # the readiness probe was answered by Readiness, which runs first
        if req.scheme != "https" or not is_provider_flow(self.gateway.hosts, flow):
            self._refuse(flow, f"{req.method} {req.scheme}://{req.pretty_host}:{req.port}{req.path[:200]}")

    def _refuse(self, flow: http.HTTPFlow, what: str) -> None:
        self.gateway.refused += 1
        flow.response = http.Response.make(
            403, f"polar gateway: {what} refused: polar_other_hosts=refuse serves provider hosts only\n",
            {"content-type": "text/plain; charset=utf-8"})


def is_provider_flow(hosts, flow: http.HTTPFlow) -> bool:
    req = flow.request
    if hostlist.is_provider(hosts, req.pretty_host, req.port):
        return True
    addr = flow.server_conn.address
    return bool(addr) and hostlist.is_provider(hosts, addr[0], addr[1])
