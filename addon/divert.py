"""The diverted path: provider tunnels served below mitmproxy's HTTP layer.

- `Divert` (next_layer): the content of a CONNECT tunnel to a provider gets mitmproxy's TLS layer (our CA's
  certificate for the CONNECT host / SNI; the tls_* hooks still run) over a raw TCP relay to the gateway's endpoint
  on 127.0.0.1, which parses the agent's HTTP itself: no HTTP flow, no per-call hooks. It runs before mitmproxy's
  own NextLayer addon (mitmdump loads -s scripts first), which leaves a layer set here alone. What is not diverted
  goes to the built-in stack and the request-hook fallback (`Reroute`). A base-URL connection (plain HTTP whose
  first request line is origin-form, `POST /openai/v1/...`, addon/base_url.py) is relayed to the endpoint the
  same way, without TLS: the endpoint reads and admits each of its requests.
- `Hops` (server_connected): before mitmproxy relays a byte over a hop to the endpoint (it awaits this hook), tell
  the endpoint whose connection it carries.
"""

from __future__ import annotations

import logging

from mitmproxy import connection
from mitmproxy.net.tls import starts_like_tls_record
from mitmproxy.proxy import layer
from mitmproxy.proxy.layers import ClientTLSLayer, HttpLayer, TCPLayer, modes
from mitmproxy.proxy.layers.http import HttpStream
from mitmproxy.proxy.layers.tls import parse_client_hello

from . import base_url
from . import hosts as hostlist
from .endpoint import Handoff
from .gateway import ENDPOINT_HOST, GatewayAddon

log = logging.getLogger("polar.gateway")


class Divert(GatewayAddon):
    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        if nextlayer.layer is not None:
            return
        c = nextlayer.context
        if len(c.layers) == 1 and isinstance(c.layers[0], modes.HttpProxy) \
                and base_url.ORIGIN_FORM.match(nextlayer.data_client()[:9]):
            self.gateway.origin_form_conns.add(c.client.id)  # for the request hook, where both forms look alike
        try:
            self._divert(nextlayer)
        except Exception:  # noqa: BLE001 — not diverted is safe: the HTTP path answers (or fails closed)
            log.exception("polar: could not divert a provider tunnel; serving it through the HTTP path")

    def _divert(self, nextlayer: layer.NextLayer) -> None:
        g = self.gateway
        o, port = g.options, g.endpoint.port
        if o is None or not o.divert or g.failure is not None or port is None:
            return  # off, failing closed (the request hook answers 503) or no endpoint yet
        c = nextlayer.context
        if len(c.layers) == 1:
            self._divert_base_url(nextlayer)
            return
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
        if not hostlist.is_provider(g.hosts, host, tport):
            try:
                hello = parse_client_hello(data)
            except ValueError:
                return
            if hello is None or not hostlist.is_provider(g.hosts, hello.sni, tport):
                return
        c.client.alpn = b"http/1.1"  # the endpoint speaks HTTP/1.1 only, whatever `http2` says
        tls_layer = ClientTLSLayer(c)
        # The relay gets a server connection of its own, to the endpoint: the tunnel's server (the provider) is
        # never connected, and the certificate still names the CONNECT host.
        hop = c.fork()
        hop.server = connection.Server(address=(ENDPOINT_HOST, port))
        tls_layer.child_layer = TCPLayer(hop, ignore=True)  # no TCP flow, no tcp_* hooks
        g.tunnels[c.client.id] = (hop.server.id, host.lower().rstrip("."), tport)
        nextlayer.layer = tls_layer

    def _divert_base_url(self, nextlayer: layer.NextLayer) -> None:
        c, g = nextlayer.context, self.gateway
        if not isinstance(c.layers[0], modes.HttpProxy) or c.client.transport_protocol != "tcp" \
                or not c.client.sockname:
            return
        if c.client.id not in g.origin_form_conns \
                or not base_url.enabled(g.options.base_url, base_url.listen_host()):
            return  # the HTTP path: a refusal that says why comes from Reroute
        c.server = connection.Server(address=(ENDPOINT_HOST, g.endpoint.port))
        g.base_url_conns[c.client.id] = (c.server.id, int(c.client.sockname[1]))
        nextlayer.layer = TCPLayer(c, ignore=True)

    def client_disconnected(self, client) -> None:
        self.gateway.tunnels.pop(client.id, None)
        self.gateway.base_url_conns.pop(client.id, None)
        self.gateway.origin_form_conns.discard(client.id)


class Hops(GatewayAddon):
    def server_connected(self, data) -> None:
        g = self.gateway
        server, port = data.server, g.endpoint.port
        if port is None or server.sockname is None or tuple(server.address or ())[:2] != (ENDPOINT_HOST, port):
            return
        tunnel = g.tunnels.get(data.client.id)
        conn_user = g.conn_users.get(data.client.id)
        direct = g.base_url_conns.get(data.client.id)
        if direct is not None and direct[0] == server.id:
            handoff = Handoff(conn_id=data.client.id, listen_port=direct[1])
        elif tunnel is not None and tunnel[0] == server.id:
            handoff = Handoff(conn_id=data.client.id, conn_user=conn_user, host=tunnel[1], port=tunnel[2])
        else:
            handoff = Handoff(conn_id=data.client.id, conn_user=conn_user)  # a rerouted flow's hop (token calls)
        g.endpoint.hand(server.sockname, handoff)

    def server_disconnected(self, data) -> None:
        if data.server.sockname is not None and self.gateway.endpoint.port is not None:
            self.gateway.endpoint.release(data.server.sockname)
