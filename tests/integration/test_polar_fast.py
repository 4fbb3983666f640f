"""scripts/polar-fast — the opt-in embedded master: same gateway behaviour as mitmdump -s addon/polar_addon.py.

Scenarios: readiness probe, a JSON and a streaming Anthropic call through real TLS with records whose token arrays
equal what the upstream sent, a non-provider host tunnelled undecrypted, and a clean SIGTERM closing the flow file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from polar.addon import record as rec
from tests.support.gateway import ROOT, proxy_client
from tests.support.records import flow_records as records
from tests.support.scripted_upstream import Reply
from tests.support.servers import free_port, probe_ready, wait_for

pytestmark = pytest.mark.integration

CA = os.path.join(ROOT, "certs", "mitmproxy-ca-cert.pem")


def ready(port: int) -> dict | None:
    """The readiness answer once it says ready; None before."""
    info = probe_ready(port)
    return info if info and info.get("ready") else None


@pytest.fixture(scope="module")
def fast_proxy(_upstream_server, tmp_path_factory):
    flows = tmp_path_factory.mktemp("fast-flows")
    port = free_port()
    log = open(tmp_path_factory.mktemp("fast-log") / "polar-fast.log", "wb")
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("https_proxy", "http_proxy", "all_proxy")}
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "polar-fast"), "--listen-port", str(port),
                             "--set", f"confdir={os.path.dirname(CA)}",
                             "--set", f"polar_upstream={_upstream_server.base_url}",
                             "--set", f"polar_flows={flows}", "--set", "polar_min_free_mb=1"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    info = wait_for(lambda: ready(port) or (proc.poll() is not None and {"dead": True}), timeout=30, interval=0.1)
    if not info or not info.get("ready"):
        proc.kill()
        pytest.fail(f"polar-fast did not become ready: {info}")
    yield {"port": port, "flows": str(flows), "proc": proc}
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    log.close()


def client(port: int) -> httpx.Client:
    return proxy_client(f"http://fast-session:x@127.0.0.1:{port}", CA, timeout=30)


BODY = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {"x-api-key": "sk-secret-fast", "anthropic-version": "2023-06-01"}


def test_1_1_json_and_stream_calls_are_answered_and_recorded(fast_proxy, upstream):
    upstream.script(Reply(text="Fast and right."), Reply(text="Streamed too."))
    with client(fast_proxy["port"]) as c:
        resp = c.post("https://api.anthropic.com/v1/messages", json=BODY, headers=HEADERS)
        assert resp.status_code == 200
        assert resp.json()["content"][0]["text"] == upstream.responses[-1].text
        with c.stream("POST", "https://api.anthropic.com/v1/messages", json={**BODY, "stream": True},
                      headers=HEADERS) as sresp:
            raw = b"".join(sresp.iter_raw())
        assert sresp.status_code == 200
    datas = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    streamed = "".join(d["delta"].get("text", "") for d in datas if d["type"] == "content_block_delta")
    assert datas[-1]["type"] == "message_stop" and streamed == upstream.responses[-1].text
    found = wait_for(lambda: len(records(fast_proxy["flows"])) >= 2, timeout=10)
    assert found
    recs = records(fast_proxy["flows"])[-2:]
    for r, truth in zip(recs, upstream.responses[-2:]):
        assert (r["protocol"], r["session"], r["error"], r["provider_status"]) == (
            "anthropic_messages", "fast-session", None, 200)
        assert rec.token_ids(r, "prompt_token_ids") == truth.prompt_token_ids
        assert rec.token_ids(r, "completion_token_ids") == truth.completion_ids
        assert b"sk-secret-fast" not in rec.pack(r)
    assert [r["stream"] for r in recs] == [False, True]


def test_1_2_other_hosts_are_not_decrypted(fast_proxy):
    # A non-provider host is tunnelled raw. Nothing listens on the target, so the client's TLS handshake fails. A
    # decrypted connection would instead complete with our (trusted) CA and get mitmproxy's 502 response.
    port = free_port()
    with client(fast_proxy["port"]) as c, pytest.raises(httpx.TransportError):
        c.get(f"https://127.0.0.1:{port}/", timeout=5)


def test_2_1_sigterm_closes_the_flow_file(fast_proxy):
    proc = fast_proxy["proc"]
    proc.send_signal(signal.SIGTERM)
    proc.wait(15)
    names = os.listdir(fast_proxy["flows"])
    assert names and all(n.endswith(".msgpack") for n in names)
