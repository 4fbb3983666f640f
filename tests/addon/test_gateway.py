"""The addon's hooks, driven through mitmproxy.test.taddons and tflow (no sockets)."""

from __future__ import annotations

import base64

import orjson

import pytest
from mitmproxy import connection, exceptions, http, tls
from mitmproxy.proxy import context
from mitmproxy.addons import proxyserver
from mitmproxy.test import taddons, tflow

from polar.addon.gateway import PolarGateway

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

    monkeypatch.setattr(gw, "_reroute", boom)
    f = provider_flow()
    gw.request(f)
    assert f.response is not None and f.response.status_code == 529  # Anthropic's "unavailable"
    assert f.request.host == "api.anthropic.com"  # answered locally: mitmproxy never contacts the real host


FAIL_CLOSED_SHAPES = [  # host, path → what each provider's own "unavailable" looks like (DESIGN §4)
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
