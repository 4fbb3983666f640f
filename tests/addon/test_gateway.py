"""The addon's hooks, driven through mitmproxy.test.taddons and tflow (no sockets)."""

from __future__ import annotations

import base64

import orjson

import pytest
from mitmproxy import connection, exceptions, http, tls
from mitmproxy.proxy import context
from mitmproxy.addons import proxyserver
from mitmproxy.test import taddons, tflow

from tests.support.addons import PolarGateway

pytestmark = pytest.mark.unit


def provider_flow(host="api.anthropic.com", path="/v1/messages", body=b'{"x":1}', headers=None):
    req = http.Request.make("POST", f"https://{host}{path}", body,
                            headers or {"x-api-key": "sk-secret", "content-type": "application/json"})
    return tflow.tflow(req=req)


@pytest.fixture
def addon(tmp_path):
    gw = PolarGateway()
    with taddons.context(gw, proxyserver.Proxyserver()) as tctx:
        tctx.configure(gw, polar_flows=str(tmp_path / "flows"))
        gw.endpoint.port = 45678  # as if running() had started it
        yield gw, tctx


def clienthello(host, port, sni):
    client = connection.Client(peername=("127.0.0.1", 5555), sockname=("127.0.0.1", 8080))
    ctx = context.Context(client, None)
    ctx.server = connection.Server(address=(host, port))
    hello = tls.ClientHello.__new__(tls.ClientHello)
    hello._client_hello = type("H", (), {"sni": sni, "alpn_protocols": [], "cipher_suites": [], "extensions": []})()
    return tls.ClientHelloData(ctx, hello)


def test_1_1_options_enforce_lazy_http2_off_and_loopback(addon):
    gw, tctx = addon
    tctx.configure(gw, connection_strategy="eager", http2=True, listen_host="")
    assert tctx.options.connection_strategy == "lazy"
    assert tctx.options.http2 is False
    assert tctx.options.listen_host == "127.0.0.1"


@pytest.mark.parametrize("name,value", [
    ("polar_backend", "triton"), ("polar_upstream", "http://127.0.0.1:8000"),
    ("polar_sampling_override", "temperature"), ("polar_sampling_override", "max_tokens=5"), ("polar_hosts", []),
    ("polar_connect_timeout", "ten"), ("polar_exact_cache_mb", "-1"), ("polar_thinking_kwarg", "enable thinking"),
])
def test_1_2_a_bad_option_fails_closed_with_one_line_naming_it(addon, caplog, name, value):
    gw, tctx = addon
    tctx.configure(gw, **{name: value})
    assert gw.failure is not None and gw.failure.startswith(f"{name}: expected ")
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and name in errors[0].getMessage() and "\n" not in errors[0].getMessage()
    flow = provider_flow()
    gw.request(flow)
    assert flow.response.status_code == 529 and b"overloaded_error" in flow.response.content
    assert "polar_rerouted" not in flow.metadata and flow.request.host == "api.anthropic.com"
    ready = tflow.tflow(req=http.Request.make("GET", "http://polar.gateway/ready"))
    gw.request(ready)
    info = orjson.loads(ready.response.content)
    assert ready.response.status_code == 503 and info["fail_closed"] is True and name in info["error"]
    tctx.configure(gw, **{name: tctx.options.default(name)})  # a good value again: serving
    assert gw.failure is None
    flow = provider_flow()
    gw.request(flow)
    assert flow.response is None and flow.metadata.get("polar_rerouted")


def test_2_1_only_provider_hosts_are_decrypted(addon):
    gw, _ = addon
    other = clienthello("example.com", 443, "example.com")
    gw.tls_clienthello(other)
    assert other.ignore_connection is True
    lookalike = clienthello("api.anthropic.com.evil.test", 443, "api.anthropic.com.evil.test")
    gw.tls_clienthello(lookalike)
    assert lookalike.ignore_connection is True
    provider = clienthello("api.anthropic.com", 443, "api.anthropic.com")
    gw.tls_clienthello(provider)
    assert provider.ignore_connection is False
    wrong_port = clienthello("api.anthropic.com", 8443, "api.anthropic.com")
    gw.tls_clienthello(wrong_port)
    assert wrong_port.ignore_connection is True


def test_2_2_provider_flow_is_rerouted_to_the_endpoint_without_secrets(addon):
    gw, _ = addon
    f = provider_flow()
    gw.request(f)
    assert f.response is None
    assert (f.request.scheme, f.request.host, f.request.port) == ("http", "127.0.0.1", 45678)
    assert f.request.path == f"/polar/{f.id}"
    assert "x-api-key" not in f.request.headers and f.request.content == b""
    pending = gw.pending[f.id]
    assert pending.host == "api.anthropic.com" and pending.body == b'{"x":1}'
    f.response = http.Response.make(200, b"")
    gw.responseheaders(f)
    assert f.response.stream is True


def test_2_3_non_provider_flow_passes_untouched(addon):
    gw, _ = addon
    f = provider_flow(host="example.com", path="/")
    gw.request(f)
    assert f.request.host == "example.com" and f.response is None and f.id not in gw.pending


def test_2_4_google_key_param_is_stripped_from_the_recorded_path(addon):
    gw, _ = addon
    f = provider_flow(host="generativelanguage.googleapis.com",
                      path="/v1beta/models/m:streamGenerateContent?alt=sse&key=AIzaSECRET")
    gw.request(f)
    assert gw.pending[f.id].path == "/v1beta/models/m:streamGenerateContent?alt=sse"


def test_2_5_a_failing_reroute_fails_closed(addon, monkeypatch):
    gw, _ = addon

    def boom(flow):
        raise RuntimeError("bug")

    monkeypatch.setattr(gw.reroute, "_reroute", boom)
    f = provider_flow()
    gw.request(f)
    assert f.response is not None and f.response.status_code == 529  # Anthropic's "unavailable"
    assert f.request.host == "api.anthropic.com"  # answered locally: mitmproxy never contacts the real host


FAIL_CLOSED_SHAPES = [  # host, path → what each provider's own "unavailable" looks like (docs/architecture.md)
    ("api.anthropic.com", "/v1/messages", 529, lambda b: b["type"] == "error" and b["error"]["type"] == "overloaded_error"),
    ("api.openai.com", "/v1/chat/completions", 503, lambda b: b["error"]["code"] == "service_unavailable"),
    ("api.openai.com", "/v1/responses", 503, lambda b: b["error"]["type"] == "server_error"),
    ("chatgpt.com", "/backend-api/codex/responses", 503, lambda b: b["error"]["code"] == "service_unavailable"),
    ("dashscope.aliyuncs.com", "/compatible-mode/v1/chat/completions", 503, lambda b: b["error"]["type"] == "server_error"),
    ("generativelanguage.googleapis.com", "/v1beta/models/m:streamGenerateContent?alt=sse", 503,
     lambda b: b["error"]["status"] == "UNAVAILABLE" and b["error"]["code"] == 503),
]


@pytest.mark.parametrize("host,path,status,shaped", FAIL_CLOSED_SHAPES)
def test_2_6_endpoint_not_running_fails_closed_in_each_providers_shape(addon, host, path, status, shaped):
    gw, _ = addon
    gw.endpoint.port = None
    f = provider_flow(host=host, path=path)
    gw.request(f)
    assert f.response.status_code == status and shaped(orjson.loads(f.response.content))
    assert f.request.host == host and "polar_rerouted" not in f.metadata


def test_3_1_proxy_credentials_name_the_session(addon):
    gw, _ = addon
    token = base64.b64encode(b"sess%2F42:x").decode()
    connect = tflow.tflow(req=http.Request.make("CONNECT", "https://api.anthropic.com:443/", b"",
                                                {"proxy-authorization": f"Basic {token}"}))
    gw.http_connect(connect)
    f = tflow.tflow(client_conn=connect.client_conn,
                    req=http.Request.make("POST", "https://api.anthropic.com/v1/messages", b"{}"))
    gw.request(f)
    assert gw.pending[f.id].conn_user == "sess/42"


# -- 4. the diverted path: next_layer decisions, the hop handoff, the agent's request as a PendingCall ---------------

def client_hello_bytes(sni: str) -> bytes:
    """A real TLS ClientHello (Python's ssl) naming `sni`."""
    import ssl

    out = ssl.MemoryBIO()
    tls_obj = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), out, server_hostname=sni)
    try:
        tls_obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def tunnel_nextlayer(tctx, host, port, data=None, sni=None):
    """The NextLayer mitmproxy asks about for a CONNECT tunnel's content: [HttpProxy, HttpLayer, HttpStream]."""
    from mitmproxy.proxy import events, layer
    from mitmproxy.proxy.layers import HttpLayer, modes
    from mitmproxy.proxy.layers.http import HTTPMode, HttpStream

    client = connection.Client(peername=("127.0.0.1", 5555), sockname=("127.0.0.1", 8080))
    ctx = context.Context(client, tctx.options)
    ctx.server = connection.Server(address=(host, port))
    modes.HttpProxy(ctx)
    HttpLayer(ctx, HTTPMode.regular)
    stream_ctx = ctx.fork()
    HttpStream(stream_ctx, 1)
    nl = layer.NextLayer(stream_ctx)
    nl.events.append(events.DataReceived(client, client_hello_bytes(sni or host) if data is None else data))
    return nl


def test_4_1_a_provider_tunnel_is_diverted_to_the_endpoint_below_mitmproxys_http_layer(addon):
    from mitmproxy.proxy.layers import ClientTLSLayer, TCPLayer

    gw, tctx = addon
    nl = tunnel_nextlayer(tctx, "api.anthropic.com", 443)
    gw.next_layer(nl)
    assert isinstance(nl.layer, ClientTLSLayer) and isinstance(nl.layer.child_layer, TCPLayer)
    relay = nl.layer.child_layer
    assert relay.flow is None  # ignore=True: no TCP flow, no tcp_* hooks
    assert relay.context.server.address == ("127.0.0.1", 45678)  # the hop goes to the endpoint only
    assert nl.context.server.address == ("api.anthropic.com", 443)  # the certificate still names the provider
    assert nl.context.client.alpn == b"http/1.1"
    assert gw.tunnels[nl.context.client.id] == (relay.context.server.id, "api.anthropic.com", 443)
    # tls_clienthello (the same context) still decrypts it: nothing there changed.
    hello = clienthello("api.anthropic.com", 443, "api.anthropic.com")
    hello.context = nl.context
    gw.tls_clienthello(hello)
    assert hello.ignore_connection is False


@pytest.mark.parametrize("host,port,sni,diverted", [
    ("127.0.0.1", 443, "api.anthropic.com", True),  # CONNECT by address, provider SNI: tls_clienthello's rule
    ("API.Anthropic.COM", 443, "x.test", True),  # the CONNECT host decides alone, in any case
    ("example.com", 443, "example.com", False),
    ("api.anthropic.com.evil.test", 443, "api.anthropic.com.evil.test", False),  # look-alike
    ("api.anthropic.com", 8443, "api.anthropic.com", False),  # wrong port
    ("127.0.0.1", 8443, "api.anthropic.com", False),  # provider SNI on a port that is not listed
])
def test_4_2_the_divert_decision_is_the_exact_host_and_port_rule(addon, host, port, sni, diverted):
    gw, tctx = addon
    nl = tunnel_nextlayer(tctx, host, port, sni=sni)
    gw.next_layer(nl)
    assert (nl.layer is not None) is diverted
    assert (nl.context.client.id in gw.tunnels) is diverted


def test_4_3_what_is_not_diverted_is_left_to_the_built_in_stack(addon):
    from mitmproxy.proxy import layer
    from mitmproxy.proxy.layers import modes

    gw, tctx = addon
    hello = client_hello_bytes("api.anthropic.com")
    # an SNI-only match whose ClientHello is not complete yet: the HTTP path decrypts it as before
    nl = tunnel_nextlayer(tctx, "127.0.0.1", 443, data=hello[:40])
    gw.next_layer(nl)
    assert nl.layer is None
    # not TLS (plain HTTP inside the tunnel)
    nl = tunnel_nextlayer(tctx, "api.anthropic.com", 443, data=b"POST /v1/messages HTTP/1.1\r\n")
    gw.next_layer(nl)
    assert nl.layer is None
    # not a CONNECT tunnel's content (the proxy connection itself: [HttpProxy])
    client = connection.Client(peername=("127.0.0.1", 5555), sockname=("127.0.0.1", 8080))
    ctx = context.Context(client, tctx.options)
    ctx.server = connection.Server(address=("api.anthropic.com", 443))
    modes.HttpProxy(ctx)
    nl = layer.NextLayer(ctx)
    gw.next_layer(nl)
    assert nl.layer is None
    # a layer another addon set is never replaced
    nl = tunnel_nextlayer(tctx, "api.anthropic.com", 443)
    marker = object()
    nl.layer = marker
    gw.next_layer(nl)
    assert nl.layer is marker and not gw.tunnels


@pytest.mark.parametrize("why", ["polar_divert=false", "failing closed", "endpoint not running"])
def test_4_4_no_diversion_when_switched_off_failing_closed_or_without_an_endpoint(addon, why):
    gw, tctx = addon
    if why == "polar_divert=false":
        tctx.configure(gw, polar_divert=False)
    elif why == "failing closed":
        tctx.configure(gw, polar_backend="triton")
        assert gw.failure is not None
    else:
        gw.endpoint.port = None
    nl = tunnel_nextlayer(tctx, "api.anthropic.com", 443)
    gw.next_layer(nl)
    assert nl.layer is None and not gw.tunnels
    if why == "failing closed":  # the request hook then answers: the provider's 503 shape
        flow = provider_flow()
        gw.request(flow)
        assert flow.response.status_code == 529


def test_4_5_server_connected_hands_each_hop_to_the_endpoint_with_who_is_behind_it(addon):
    from mitmproxy.proxy import server_hooks

    gw, tctx = addon
    token = base64.b64encode(b"sess%2F42:x").decode()
    nl = tunnel_nextlayer(tctx, "api.anthropic.com", 443)
    client = nl.context.client
    connect = tflow.tflow(client_conn=client, req=http.Request.make(
        "CONNECT", "https://api.anthropic.com:443/", b"", {"proxy-authorization": f"Basic {token}"}))
    gw.http_connect(connect)
    gw.next_layer(nl)
    hop = nl.layer.child_layer.context.server
    hop.sockname = ("127.0.0.1", 40001)
    gw.server_connected(server_hooks.ServerConnectionHookData(server=hop, client=client))
    handed = gw.endpoint._handed[("127.0.0.1", 40001)]
    assert (handed.conn_id, handed.conn_user, handed.host, handed.port, handed.diverted) == (
        client.id, "sess/42", "api.anthropic.com", 443, True)
    # a rerouted flow's hop to the endpoint (the fallback) is handed too, as a token connection
    other = connection.Server(address=("127.0.0.1", 45678), sockname=("127.0.0.1", 40002))
    gw.server_connected(server_hooks.ServerConnectionHookData(server=other, client=client))
    assert gw.endpoint._handed[("127.0.0.1", 40002)].diverted is False
    # anything else is not the endpoint's business
    real = connection.Server(address=("api.anthropic.com", 443), sockname=("127.0.0.1", 40003))
    gw.server_connected(server_hooks.ServerConnectionHookData(server=real, client=client))
    assert ("127.0.0.1", 40003) not in gw.endpoint._handed
    gw.server_disconnected(server_hooks.ServerConnectionHookData(server=hop, client=client))
    assert ("127.0.0.1", 40001) not in gw.endpoint._handed
    gw.client_disconnected(client)
    assert client.id not in gw.tunnels and client.id not in gw.conn_users


def _diverted_request(headers, body=b'{"x":1}', target="/v1/messages", too_large=False, conn_user="sess"):
    from polar.addon.endpoint import Handoff, Request

    handoff = Handoff(conn_id="c1", conn_user=conn_user, host="api.anthropic.com", port=443)
    return Request(handoff, "POST", target, [(k.encode(), v.encode()) for k, v in headers], body, too_large)


def test_4_6_the_agents_request_becomes_the_pending_call_the_request_hook_builds(addon):
    import gzip

    gw, _ = addon
    headers = [("Host", "api.anthropic.com"), ("X-Api-Key", "sk-secret"), ("Expect", "100-continue"),
               ("Content-Encoding", "gzip"), ("content-type", "application/json")]
    p = gw._pending_from(_diverted_request(headers, gzip.compress(b'{"x":1}')))
    assert (p.conn_id, p.conn_user, p.host, p.method, p.path) == (
        "c1", "sess", "api.anthropic.com", "POST", "/v1/messages")
    assert p.headers == [h for h in headers if h[0] != "Expect"]  # mitmproxy answers and drops Expect too
    assert p.body == b'{"x":1}' and p.decode_error is None
    assert p.record_id and p.t_start > 0
    # the same request through the request hook
    f = provider_flow(headers={k: v for k, v in headers if k != "Expect"}, body=b'{"x":1}')  # make() encodes it
    gw.request(f)
    hooked = gw.pending[f.id]
    assert (hooked.host, hooked.path, hooked.body) == (p.host, p.path, p.body)


def test_4_7_key_stripping_host_header_bad_encoding_and_the_size_cap(addon):
    gw, _ = addon
    target = "/v1beta/models/m:streamGenerateContent?alt=sse&key=AIzaSECRET"
    p = gw._pending_from(_diverted_request([("host", "generativelanguage.googleapis.com:443")], target=target))
    assert p.path == "/v1beta/models/m:streamGenerateContent?alt=sse"
    assert p.host == "generativelanguage.googleapis.com"  # the Host header's name, as pretty_host
    p = gw._pending_from(_diverted_request([("content-encoding", "gzip")], body=b"\x1f\x8b not gzip"))
    assert p.decode_error == "cannot decode content-encoding 'gzip'" and p.host == "api.anthropic.com"
    big = b"\x1f\x8b" + b"x" * 100
    p = gw._pending_from(_diverted_request([("content-encoding", "gzip")], body=big, too_large=True))
    assert p.body == big and p.decode_error is None  # refused on its size by handle_call, never decoded
    p = gw._pending_from(_diverted_request([("proxy-authorization", "Basic " + base64.b64encode(b"s2:x").decode())],
                                           conn_user=None))
    assert p.conn_user == "s2"


def test_4_8_a_diverted_call_on_a_gateway_gone_failing_closed_gets_the_providers_503(addon):
    import asyncio

    gw, tctx = addon
    tctx.configure(gw, polar_backend="triton")

    class Capture:
        async def respond(self, status, headers, body):
            self.answer = (status, headers, body)

    cap = Capture()
    asyncio.run(gw._serve(_diverted_request([("host", "api.anthropic.com")]), cap))
    status, headers, body = cap.answer
    assert status == 529 and b"overloaded_error" in body and b"misconfigured" in body
    assert gw.served == {"diverted": 0, "rerouted": 0, "base_url": 0, "base_url_refused": 0}


# -- 5. polar_other_hosts: refuse serves provider flows only (sandboxed rollouts) -----------------------------------

def connect_flow(host: str, port: int, user: bytes = b"run%2Ft%2F0%2F0:x"):
    token = base64.b64encode(user).decode()
    return tflow.tflow(req=http.Request.make("CONNECT", f"https://{host}:{port}/", b"",
                                             {"proxy-authorization": f"Basic {token}"}))


def plain_flow(url: str, method: str = "GET"):
    """A plain-HTTP proxy request as mitmproxy parses it: absolute-form, so its authority is the URL's."""
    req = http.Request.make(method, url, b"")
    req.authority = url.split("://", 1)[1].split("/", 1)[0]
    return tflow.tflow(req=req)


def refused_line(flow) -> str:
    assert flow.response is not None and flow.response.status_code == 403
    body = flow.response.content.decode()
    assert body.endswith("\n") and "\n" not in body[:-1] and "polar_other_hosts=refuse" in body
    return body


@pytest.mark.parametrize("host,port", [("example.com", 443), ("127.0.0.1", 8000), ("localhost", 443),
                                       ("10.1.2.3", 443), ("192.168.0.1", 22), ("[::1]", 443),
                                       ("api.anthropic.com", 80), ("api.anthropic.com", 8443),
                                       ("api.anthropic.com.evil.example", 443)])
def test_5_1_refuse_answers_every_non_provider_connect_with_403_naming_the_option(addon, host, port):
    gw, tctx = addon
    tctx.configure(gw, polar_other_hosts="refuse")
    f = connect_flow(host, port)
    gw.http_connect(f)
    assert f"CONNECT {host.strip('[]')}:{port}" in refused_line(f)


def test_5_2_refuse_keeps_provider_tunnels_and_tunnel_keeps_everything(addon):
    gw, tctx = addon
    for mode in ("tunnel", "refuse"):
        tctx.configure(gw, polar_other_hosts=mode)
        f = connect_flow("api.anthropic.com", 443)
        gw.http_connect(f)
        assert f.response is None and gw.conn_users[f.client_conn.id] == "run/t/0/0"
    tctx.configure(gw, polar_other_hosts="tunnel")
    f = connect_flow("example.com", 443)
    gw.http_connect(f)
    assert f.response is None  # the default: tunnelled raw, as before


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1/models", "http://polar.gateway/admin/flows",
                                 "http://api.anthropic.com/v1/messages", "http://10.0.0.1/", "http://example.com/x",
                                 "http://127.0.0.1:45678/polar/some-flow"])
def test_5_3_refuse_answers_plain_http_with_403_but_the_readiness_probe(addon, url):
    gw, tctx = addon
    tctx.configure(gw, polar_other_hosts="refuse")
    f = plain_flow(url, "POST" if "messages" in url else "GET")
    gw.request(f)
    refused_line(f)
    assert "polar_rerouted" not in f.metadata and f.id not in gw.pending
    ready = plain_flow("http://polar.gateway/ready")
    gw.request(ready)
    info = orjson.loads(ready.response.content)
    assert ready.response.status_code == 200 and info["other_hosts"] == "refuse" and info["refused"] >= 1


def test_5_4_under_refuse_a_decrypted_provider_flow_is_still_served(addon):
    gw, tctx = addon
    tctx.configure(gw, polar_other_hosts="refuse")
    f = provider_flow()
    gw.request(f)
    assert f.response is None and f.metadata.get("polar_rerouted")


def test_5_5_readiness_reports_other_hosts_exact_version_and_tls_failures_per_user(addon):
    gw, tctx = addon
    ready = plain_flow("http://polar.gateway/ready")
    gw.request(ready)
    info = orjson.loads(ready.response.content)
    assert info["other_hosts"] == "tunnel" and info["exact"] is False and "version" in info
    assert info["tls_failures"] == {}
    tctx.configure(gw, polar_exact=True, polar_other_hosts="refuse")
    f = connect_flow("api.openai.com", 443, b"run%2Fpreflight%2F1:x")
    gw.http_connect(f)
    data = tls.TlsData(f.client_conn, context.Context(f.client_conn, None))
    gw.tls_failed_client(data)
    gw.tls_failed_client(data)
    ready = plain_flow("http://polar.gateway/ready")
    gw.request(ready)
    info = orjson.loads(ready.response.content)
    assert (info["other_hosts"], info["exact"]) == ("refuse", True)
    assert info["tls_failures"] == {"run/preflight/1": 2}


def test_5_6_a_bad_value_fails_closed_and_refuses(addon):
    gw, tctx = addon
    tctx.configure(gw, polar_other_hosts="block")
    assert gw.failure == "polar_other_hosts: expected tunnel or refuse, got 'block'"
    f = connect_flow("example.com", 443)
    gw.http_connect(f)
    refused_line(f)


def test_5_7_under_refuse_an_agents_readiness_probe_learns_only_whether_it_is_ready(addon):
    """A sandboxed client always carries its session: it gets `ready` alone, not the backend URL, the flow
    directory or the other samples' counters (the operator's probe, without credentials, gets everything)."""
    gw, tctx = addon
    tctx.configure(gw, polar_other_hosts="refuse")
    agent = plain_flow("http://polar.gateway/ready")
    agent.request.headers["proxy-authorization"] = "Basic " + base64.b64encode(b"run/t/0/0:x").decode()
    gw.request(agent)
    assert agent.response.status_code == 200 and orjson.loads(agent.response.content) == {"ready": True}
    operator = plain_flow("http://polar.gateway/ready")
    gw.request(operator)
    assert {"upstream", "flows", "tls_failures", "served"} <= set(orjson.loads(operator.response.content))
