"""Security: no secret reaches a record, the log or the backend; a provider request never reaches the real host; only
exact provider host names are decrypted. (test_proxy.py covers non-provider TLS, loopback bind, CA permissions.)

The "real host" is a local TLS server we control (a sentinel counting connections): polar_hosts names it as
`api.anthropic.com:<port>` etc., and the client tunnels `CONNECT 127.0.0.1:<port>` with the provider's name as SNI
and Host — so if the proxy ever forwarded a flow, it would land exactly there.

Scenarios: 1.x secrets · 2.x nothing reaches the real host · 3.x exact host matching.
"""

from __future__ import annotations

import os
import ssl
import uuid

import anthropic
import httpx
import openai
import pytest

from polar.addon.hosts import protocol_for
from polar.addon.provider_errors import unavailable
from tests.reliability import GOOGLE
from tests.support.gateway import start_gateway
from tests.support.scripted_upstream import Reply
from tests.support.sdk import anthropic_sdk, genai_sdk, openai_sdk
from tests.support.sentinel import Sentinel, tunnel
from tests.support.tls import polar_import_blocker

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:12]
SECRETS = {
    "anthropic_key": f"sk-ant-api03-SECRET{TAG}",
    "openai_key": f"sk-proj-SECRET{TAG}",
    "google_key": f"AIzaSECRET{TAG}",
    "cookie": f"SESSIONCOOKIE{TAG}",
    "proxy_password": f"PROXYPASS{TAG}",
    "account": f"ACCOUNT{TAG}",
}


@pytest.fixture(scope="module")
def sentinel_gateway(_upstream_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("sentinel")
    sentinel = Sentinel(str(base))
    other = Sentinel(str(base))  # the right name on a port polar_hosts does not list
    names = ["api.anthropic.com", "api.openai.com", "generativelanguage.googleapis.com"]
    with start_gateway(_upstream_server.base_url, str(base / "run"), str(base / "flows"),
                       sets=[f"polar_hosts={n}:{sentinel.port}" for n in names]) as gw:
        gw.sentinel, gw.other = sentinel, other
        yield gw
    sentinel.close()
    other.close()


# -- 1. secrets ------------------------------------------------------------------------------------------------------


def test_1_1_no_key_cookie_or_proxy_password_in_records_logs_or_upstream(upstream, tmp_path):
    base = tmp_path
    with start_gateway(upstream.base_url, str(base / "run"), str(base / "flows")) as gw:
        proxy = f"http://secret-session:{SECRETS['proxy_password']}@127.0.0.1:{gw.port}"
        cookie = {"cookie": f"sid={SECRETS['cookie']}", "chatgpt-account-id": SECRETS["account"]}
        upstream.script(*[Reply(text="fine")] * 20)
        a = anthropic_sdk(gw, proxy=proxy, api_key=SECRETS["anthropic_key"], default_headers=cookie)
        a.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
        with a.messages.stream(model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}]) as s:
            s.get_final_message()
        with pytest.raises(anthropic.BadRequestError):
            a.messages.create(model="m", max_tokens=20, messages=[{"role": "tool", "content": "x"}])
        o = openai_sdk(gw, proxy=proxy, api_key=SECRETS["openai_key"], default_headers=cookie)
        o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        list(o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
        with pytest.raises(openai.BadRequestError):
            o.chat.completions.create(model="m", messages=[{"role": "nobody", "content": "hi"}])
        o.responses.create(model="m", input="hi")
        list(o.responses.create(model="m", input="hi", stream=True))
        g = genai_sdk(gw, proxy=proxy, api_key=SECRETS["google_key"], headers=cookie)
        g.models.generate_content(model="gemini-test", contents="hi")
        list(g.models.generate_content_stream(model="gemini-test", contents="hi"))
        # The key as a query parameter (older Gemini clients), and a backend failure on the error path.
        upstream.script(Reply(fault="status:503"))
        with gw.http_client(session=None) as client:
            client.post(f"{GOOGLE.url(False)}?key={SECRETS['google_key']}", json=GOOGLE.body(False, "hi"),
                        headers={"cookie": f"sid={SECRETS['cookie']}"})
        records = gw.records()
        assert len(records) >= 11 and {r["protocol"] for r in records} == {
            "anthropic_messages", "openai_chat", "openai_responses", "google_generate"}
        assert any(r["error"] for r in records)
    blobs = {}
    for directory in (gw.flows_dir, gw.run_dir):
        for name in os.listdir(directory):
            with open(os.path.join(directory, name), "rb") as fh:
                blobs[name] = fh.read()
    assert any(name.endswith(".msgpack") for name in blobs) and any(name.endswith(".log") for name in blobs)
    upstream_seen = repr([(r.headers, r.body) for r in upstream.requests]).encode()
    for label, secret in SECRETS.items():
        for name, blob in blobs.items():
            assert secret.encode() not in blob, f"{label} found in {name}"
        assert secret.encode() not in upstream_seen, f"{label} reached the backend"
    # Redacted, not dropped: the record shows that the agent sent them.
    r = next(r for r in records if r["protocol"] == "anthropic_messages")
    headers = {k.lower(): v for k, v in r["request_headers"]}
    present = {"x-api-key", "authorization", "cookie", "chatgpt-account-id"} & set(headers)
    assert {"cookie", "chatgpt-account-id"} <= present and present & {"x-api-key", "authorization"}, sorted(headers)
    assert all(headers[k] == "<redacted>" for k in present)
    assert r["session"] == "secret-session"


# -- 2. nothing reaches the real host --------------------------------------------------------------------------


def cases(api_key: str = "sk-sentinel") -> list[tuple[str, str, bytes, dict]]:
    """(sni, path, body, headers): requests that fail in translation, plus a good one and side endpoints."""
    h = {"content-type": "application/json", "x-api-key": api_key, "authorization": f"Bearer {api_key}"}
    gpath = "/v1beta/models/gemini-test:generateContent"
    return [
        ("api.anthropic.com", "/v1/messages", b"{not json", h),
        ("api.anthropic.com", "/v1/messages", b'{"model": "m", "max_tokens": 5}', h),
        ("api.anthropic.com", "/v1/messages", b'{"model": "m", "max_tokens": 5, "messages": [{"role": 7}]}', h),
        ("api.anthropic.com", "/v1/messages", b"\x1f\x8bnot gzip", {**h, "content-encoding": "gzip"}),
        ("api.anthropic.com", "/v1/organizations", b"", h),
        ("api.anthropic.com", "/v1/messages", b'{"model": "m", "max_tokens": 5, "messages": '
                                              b'[{"role": "user", "content": "ok"}]}', h),
        ("api.openai.com", "/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user"}], "n": 3}', h),
        ("api.openai.com", "/v1/responses", b'{"model": "m", "input": 5, "previous_response_id": "r"}', h),
        ("api.openai.com", "/v1/responses", b"[]", h),
        # A body that makes the Google codec raise an unexpected exception (not a clean 400).
        ("generativelanguage.googleapis.com", gpath, b'{"contents": [{"role": "model", "parts": '
                                                     b'[{"functionCall": -1}]}]}', h),
        ("generativelanguage.googleapis.com", gpath, b'{"contents": 5}', h),
    ]


def test_2_1_failed_translations_never_reach_the_real_host(sentinel_gateway, upstream):
    gw = sentinel_gateway
    gw.mark()
    statuses = []
    for sni, path, body, headers in cases():
        status, raw = tunnel(gw.port, gw.sentinel.port, sni, gw.ca_pem, path=path, body=body, headers=headers)
        assert status != 502 and b"real-host" not in raw, raw[:300]
        statuses.append(status)
    assert gw.sentinel.connections == 0
    assert 200 in statuses and 404 in statuses and statuses.count(400) >= 6, statuses
    assert len(gw.records()) == len(cases()) - 1  # every generation request, bad or not, has its record


def test_2_2_package_import_failure_never_reaches_the_real_host(upstream, tmp_path):
    sentinel = Sentinel(str(tmp_path))
    gw = start_gateway(upstream.base_url, str(tmp_path / "run"), str(tmp_path / "flows"),
                       sets=[f"polar_hosts=api.anthropic.com:{sentinel.port}"], extra_args=["--allow-fail-closed"],
                       env=polar_import_blocker(tmp_path))
    try:
        for sni, path, body, headers in cases()[:6]:
            status, raw = tunnel(gw.port, sentinel.port, sni, gw.ca_pem, path=path, body=body, headers=headers)
            # Each provider's own "unavailable" (Anthropic's is 529 overloaded_error), routed by the exact host.
            want = unavailable(protocol_for(sni, path), "polar gateway failed to load; see the proxy log")
            assert (status, raw) == want[::2], raw[:300]
        # a base-URL client (origin-form to the proxy's own address) gets the same answer, never a forward
        resp = httpx.post(f"http://127.0.0.1:{gw.port}/anthropic/v1/messages", json={"model": "m"}, trust_env=False,
                          timeout=30)
        assert resp.status_code == 503 and "failed to load" in resp.json()["error"]["message"], resp.text
        # (scripts/proxy's own start-up check GETs /v1/models; nothing was generated)
        assert sentinel.connections == 0 and [r for r in upstream.requests if r.method != "GET"] == []
    finally:
        gw.stop()
        sentinel.close()


# -- 3. exact host matching ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sni", ["api.anthropic.com.evil.test", "xapi.anthropic.com", "anthropic.com",
                                 "api-anthropic.com", "api.anthropic.co"])
def test_3_1_a_look_alike_host_is_not_decrypted(sentinel_gateway, sni):
    gw = sentinel_gateway
    before = gw.sentinel.connections
    # Tunnelled raw to the real host, whose own certificate our-CA-only clients reject: nobody minted one for it.
    with pytest.raises(ssl.SSLCertVerificationError):
        tunnel(gw.port, gw.sentinel.port, sni, gw.ca_pem, path="/v1/messages", body=b"{}")
    assert gw.sentinel.connections == before + 1


def test_3_2_the_right_name_on_an_unlisted_port_is_not_decrypted(sentinel_gateway):
    gw = sentinel_gateway
    with pytest.raises(ssl.SSLCertVerificationError):
        tunnel(gw.port, gw.other.port, "api.anthropic.com", gw.ca_pem, path="/v1/messages", body=b"{}")
    assert gw.other.connections == 1


def test_3_3_the_exact_name_in_any_case_is_decrypted_and_answered_locally(sentinel_gateway, upstream):
    gw = sentinel_gateway
    before = gw.sentinel.connections
    for sni in ("API.Anthropic.COM", "api.anthropic.com"):
        status, raw = tunnel(gw.port, gw.sentinel.port, sni, gw.ca_pem, path="/v1/messages",
                             body=b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}',
                             headers={"content-type": "application/json"})
        assert status == 200 and b'"type":"message"' in raw, raw[:300]
    assert gw.sentinel.connections == before

