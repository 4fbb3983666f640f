"""addon/base_url.py: the base-URL addresses, the admission rules, when the mode is on, which plain-HTTP flows are
base-URL requests; and through the addons (taddons): the request-hook path reroutes one to the endpoint with its
provider host, session and `connect`, refuses the others in their protocol's shape, and Refuse leaves them to it."""

from __future__ import annotations

import base64

import orjson
import pytest
from mitmproxy import http
from mitmproxy.addons import proxyserver
from mitmproxy.test import taddons, tflow

from polar.addon import base_url as bu
from tests.support.addons import PolarGateway

PORT = 45123


@pytest.mark.parametrize("target, host, path, session", [
    ("/anthropic/v1/messages", "api.anthropic.com", "/v1/messages", None),
    ("/anthropic/v1/messages?beta=true", "api.anthropic.com", "/v1/messages?beta=true", None),
    ("/openai/v1/chat/completions", "api.openai.com", "/v1/chat/completions", None),
    ("/openai/v1/responses", "api.openai.com", "/v1/responses", None),
    ("/google/v1beta/models/g:streamGenerateContent?alt=sse", "generativelanguage.googleapis.com",
     "/v1beta/models/g:streamGenerateContent?alt=sse", None),
    ("/s/run%2Ftask%2F0%2F0/openai/v1/chat/completions", "api.openai.com", "/v1/chat/completions", "run/task/0/0"),
    ("/s/a%3Ab%40c/anthropic/v1/messages", "api.anthropic.com", "/v1/messages", "a:b@c"),
])
def test_1_1_addresses_map_to_the_provider_host_and_the_path_after_the_prefix(target, host, path, session):
    assert bu.parse_target(target) == bu.Address(host=host, path=path, session=session)


@pytest.mark.parametrize("target, kind", [
    ("/v1/chat/completions", "not_found"), ("/mistral/v1/chat", "not_found"), ("/", "not_found"),
    ("/s/x", "not_found"), ("/s//openai/v1/chat/completions", "bad_request"),
    ("/s/%0A/openai/v1/chat/completions", "bad_request"), ("/s/ok/unknown/v1", "not_found"),
])
def test_1_2_anything_else_is_refused_with_a_kind(target, kind):
    with pytest.raises(bu.BaseUrlRefused) as got:
        bu.parse_target(target)
    assert got.value.kind == kind


JSON = [("content-type", "application/json")]


@pytest.mark.parametrize("host", [f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"LOCALHOST:{PORT}", f"[::1]:{PORT}"])
def test_2_1_the_listen_address_with_a_json_body_is_admitted(host):
    bu.admission("POST", [("Host", host), *JSON], b"{}", PORT, "127.0.0.1")
    bu.admission("GET", [("Host", host)], b"", PORT, "127.0.0.1")  # no body: no content type needed


@pytest.mark.parametrize("headers, body, kind, words", [
    ([("host", f"127.0.0.1:{PORT + 1}"), *JSON], b"{}", "forbidden", "listen address"),
    ([("host", "127.0.0.1"), *JSON], b"{}", "forbidden", "listen address"),
    ([("host", f"evil.example:{PORT}"), *JSON], b"{}", "forbidden", "listen address"),
    ([*JSON], b"{}", "forbidden", "listen address"),
    ([("host", f"127.0.0.1:{PORT}"), ("origin", "null"), *JSON], b"{}", "forbidden", "Origin"),
    ([("host", f"127.0.0.1:{PORT}"), ("content-type", "text/plain")], b"{}", "bad_request", "content-type"),
    ([("host", f"127.0.0.1:{PORT}"), ("content-type", "application/x-www-form-urlencoded")], b"a=b",
     "bad_request", "content-type"),
    ([("host", f"127.0.0.1:{PORT}")], b"{}", "bad_request", "content-type"),
])
def test_2_2_other_hosts_origins_and_non_json_bodies_are_refused(headers, body, kind, words):
    with pytest.raises(bu.BaseUrlRefused) as got:
        bu.admission("POST", headers, body, PORT, "127.0.0.1")
    assert got.value.kind == kind and words in str(got.value)


def test_2_3_a_chosen_listen_host_is_admitted_too_and_json_media_types_count():
    bu.admission("POST", [("host", f"10.1.2.3:{PORT}"), ("content-type", "application/vnd.api+json")], b"{}",
                 PORT, "10.1.2.3")
    assert bu.is_json_type("application/json; charset=utf-8") and not bu.is_json_type("text/json")


@pytest.mark.parametrize("setting, listen, on", [
    ("auto", "127.0.0.1", True), ("auto", "::1", True), ("auto", "localhost", True), ("auto", "0.0.0.0", False),
    ("auto", "", False), ("auto", "10.0.0.5", False), ("on", "10.0.0.5", True), ("off", "127.0.0.1", False),
])
def test_2_4_the_mode_is_on_by_default_only_on_loopback(setting, listen, on):
    assert bu.enabled(setting, listen) is on


# -- 3. through the addons ------------------------------------------------------------------------------------


@pytest.fixture
def addon(tmp_path):
    gw = PolarGateway()
    with taddons.context(gw, proxyserver.Proxyserver()) as tctx:
        tctx.configure(gw, polar_flows=str(tmp_path / "flows"), listen_host="127.0.0.1")
        gw.endpoint.port = 45678  # as if running() had started it
        yield gw, tctx


def origin_flow(gw, path: str, headers: dict | None = None, body: bytes = b"{}", host: str = f"127.0.0.1:{PORT}"):
    """An origin-form request on the proxy's own connection, as mitmproxy parses it (no authority; host and port
    from the Host header), its connection marked as Divert.next_layer marks one whose first bytes are origin-form."""
    hdrs = {"host": host, "content-type": "application/json", **(headers or {})}
    req = http.Request.make("POST", f"http://{host}{path}", body, hdrs)
    req.authority = ""
    f = tflow.tflow(req=req)
    f.client_conn.sockname = ("127.0.0.1", PORT)
    gw.origin_form_conns.add(f.client_conn.id)
    return f


def test_3_1_the_request_hook_reroutes_a_base_url_call_with_its_provider_host_and_session(addon):
    gw, _ = addon
    auth = "Basic " + base64.b64encode(b"sample-3:x").decode()
    f = origin_flow(gw, "/s/sample-3/anthropic/v1/messages?beta=true", {"proxy-authorization": auth,
                                                                   "x-api-key": "sk-secret"})
    gw.request(f)
    assert f.response is None and f.metadata["polar_rerouted"] is True
    assert (f.request.host, f.request.port, f.request.path) == ("127.0.0.1", 45678, f"/polar/{f.id}")
    assert dict(f.request.headers) == {"host": "127.0.0.1:45678", "content-length": "0"}  # no agent header goes over
    pending = gw.pending[f.id]
    assert (pending.host, pending.path, pending.connect, pending.path_session, pending.conn_user) == (
        "api.anthropic.com", "/v1/messages?beta=true", "base_url", "sample-3", "sample-3")


@pytest.mark.parametrize("refuse", [False, True])
@pytest.mark.parametrize("path, headers, status, protocol_key", [
    ("/openai/v1/chat/completions", {"origin": "https://evil.example"}, 403, "error"),
    ("/s/other/anthropic/v1/messages", {"proxy-authorization": "Basic " + base64.b64encode(b"me:x").decode()},
     400, "type"),
    ("/google/v1beta/models/g:generateContent", {"content-type": "text/plain"}, 400, "error"),
    ("/nowhere/v1", {}, 404, "error"),
])
def test_3_2_refusals_are_the_protocols_and_refuse_mode_leaves_them_to_the_gateway(addon, refuse, path, headers,
                                                                                    status, protocol_key):
    gw, tctx = addon
    tctx.configure(gw, polar_other_hosts="refuse" if refuse else "tunnel")
    f = origin_flow(gw, path, headers)
    gw.request(f)
    assert f.response.status_code == status and f.id not in gw.pending
    assert protocol_key in orjson.loads(f.response.content)
    assert not any(k.lower().startswith("access-control-") for k in f.response.headers)
    assert gw.served["base_url_refused"] == 1 and gw.refused == 0


def test_3_3_off_and_non_loopback_refuse_naming_the_option_and_other_hosts_stay_proxied(addon):
    gw, tctx = addon
    tctx.configure(gw, polar_base_url="off")
    f = origin_flow(gw, "/openai/v1/chat/completions")
    gw.request(f)
    assert f.response.status_code == 403 and b"polar_base_url" in f.response.content
    tctx.configure(gw, polar_base_url="auto", listen_host="0.0.0.0")
    f = origin_flow(gw, "/openai/v1/chat/completions")
    gw.request(f)
    assert f.response.status_code == 403 and b"polar_base_url=on" in f.response.content
    tctx.configure(gw, polar_base_url="on")
    f = origin_flow(gw, "/openai/v1/chat/completions")
    gw.request(f)
    assert f.response is None and gw.pending[f.id].connect == "base_url"
    # an absolute-form proxy request to another host is no base-URL request, and one inside a CONNECT tunnel neither
    # (mitmproxy clears the authority of regular-mode HTTP/1 requests before the hooks: host and port decide)
    other = tflow.tflow(req=http.Request.make("GET", "http://example.com/x"))
    other.request.authority = ""
    other.client_conn.sockname = ("127.0.0.1", PORT)
    assert bu.own_address_port(other, tunnelled=False, origin_form=False) is None
    backend = tflow.tflow(req=http.Request.make("GET", f"http://127.0.0.1:{PORT + 1}/v1/models"))
    backend.request.authority = ""
    backend.client_conn.sockname = ("127.0.0.1", PORT)
    # another port on loopback: a proxy request, which polar_other_hosts=refuse refuses as ever
    assert bu.own_address_port(backend, tunnelled=False, origin_form=False) is None
    tctx.configure(gw, polar_other_hosts="refuse")
    before = gw.served["base_url_refused"]
    gw.request(backend)
    assert backend.response.status_code == 403 and b"polar_other_hosts=refuse" in backend.response.content
    assert gw.refused == 1 and gw.served["base_url_refused"] == before
    assert bu.own_address_port(origin_flow(gw, "/openai/v1/chat/completions"), tunnelled=True, origin_form=True) is None
    mine = tflow.tflow(req=http.Request.make("POST", f"http://127.0.0.1:{PORT}/openai/v1/chat/completions"))
    mine.request.authority = f"127.0.0.1:{PORT}"
    mine.client_conn.sockname = ("127.0.0.1", PORT)
    assert bu.own_address_port(mine, tunnelled=False, origin_form=False) == PORT  # absolute-form to our own address
