"""The gateway's control endpoints (docs/architecture.md#the-trainer-side): hold generation while a backend reloads its
weights, release it with the new policy version, and the version stamped on every record.

Scenarios: 1.x the token file · 2.x the hold state (an event loop, no sockets) · 3.x the HTTP answers (no sockets) ·
4.x through a real mitmdump: own port, token, held requests wait then go, in-flight streams finish, the version on
records (vLLM's /weight_info at start, then each release) · 5.x a hold nobody releases expires.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading

import h11
import httpx
import pytest

from polar.addon import control as ctl
from tests.support.gateway import start_gateway
from tests.support.scripted_upstream import Reply, ScriptedUpstream, _Handler, _Server
from tests.support.servers import wait_for

CHAT = "https://api.openai.com/v1/chat/completions"


# -- 1. the token file ------------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_1_1_the_token_file_is_created_0600_then_reused(tmp_path):
    path = tmp_path / "control-token"
    token = ctl.ensure_token(str(path))
    assert len(token) == 64 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ctl.ensure_token(str(path)) == token


@pytest.mark.unit
def test_1_2_an_open_token_file_is_tightened_and_an_empty_or_uncreatable_one_is_an_error(tmp_path):
    path = tmp_path / "t"
    path.write_text("secret\n")
    os.chmod(path, 0o644)
    assert ctl.ensure_token(str(path)) == "secret" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    path.write_text("  \n")
    with pytest.raises(ctl.TokenFileError, match="^polar_control_token: .* is empty$"):
        ctl.ensure_token(str(path))
    with pytest.raises(ctl.TokenFileError, match="^polar_control_token: cannot create"):
        ctl.ensure_token("/dev/null/token")


# -- 2. the hold state ------------------------------------------------------------------------------------------------


async def _held_generation_waits_until_released() -> list:
    c = ctl.Control(hold_timeout=60)
    events: list = []

    async def call(name: str) -> None:
        async with c.generation() as version:
            events.append((name, version, c.in_flight))

    c.hold()
    task = asyncio.create_task(call("a"))
    while c.waiting == 0:
        await asyncio.sleep(0)
    events.append(("state", c.state()["held"], c.state()["waiting"]))
    c.release("v2")
    await task
    events.append(("after", c.held, c.in_flight, c.weight_version))
    return events


@pytest.mark.unit
def test_2_1_a_held_generation_waits_and_goes_with_the_released_version():
    assert asyncio.run(_held_generation_waits_until_released()) == [
        ("state", True, 1), ("a", "v2", 1), ("after", False, 0, "v2")]


async def _expiry() -> tuple:
    c = ctl.Control(hold_timeout=0.05)
    c.weight_version = "v1"
    c.hold()
    async with c.generation() as version:  # returns only once the hold has expired
        pass
    return version, c.held, c.expired


@pytest.mark.unit
def test_2_2_a_hold_nobody_releases_expires_and_serving_resumes_with_the_old_version():
    assert asyncio.run(_expiry()) == ("v1", False, 1)


@pytest.mark.unit
def test_2_3_the_backends_version_counts_until_a_release_names_one():
    c = ctl.Control()
    c.adopt_backend_version("default")
    assert c.weight_version == "default"
    c.release(None)  # a release without a version keeps it
    c.adopt_backend_version(None)
    assert c.weight_version == "default"
    c.release("7")
    c.adopt_backend_version("default")  # a later probe does not undo the reloader's word
    assert c.weight_version == "7"


# -- 3. the HTTP answers ----------------------------------------------------------------------------------------------


def _request(method: str, target: str, token: bytes | None) -> h11.Request:
    headers = [(b"host", b"127.0.0.1")] + ([(b"x-polar-control-token", token)] if token is not None else [])
    return h11.Request(method=method, target=target, headers=headers)


async def _answers() -> list:
    server = ctl.ControlServer(ctl.Control(hold_timeout=60), "tok")
    out = []
    for method, target, token, body in [
        ("GET", "/admin/state", None, b""), ("GET", "/admin/state", b"tik", b""), ("GET", "/admin/state", b"tok", b""),
        ("POST", "/admin/hold", b"tok", b""), ("POST", "/admin/release", b"tok", b'{"weight_version": 3}'),
        ("POST", "/admin/release", b"tok", b"[1]"), ("POST", "/admin/release", b"tok", b'{"weight_version": "s1"}'),
        ("GET", "/admin/hold", b"tok", b""), ("GET", "/other", b"tok", b""),
    ]:
        status, doc = server.answer(_request(method, target, token), body)
        out.append((status, doc.get("held"), doc.get("weight_version")))
    server.control.close()
    return out


@pytest.mark.unit
def test_3_1_every_request_needs_the_token_then_hold_release_state():
    assert asyncio.run(_answers()) == [
        (401, None, None), (403, None, None), (200, False, None), (200, True, None),
        (400, None, None), (400, None, None), (200, False, "s1"), (405, None, None), (404, None, None)]


@pytest.mark.unit
def test_3_2_without_a_token_file_nothing_is_served():
    server = ctl.ControlServer(ctl.Control(), None)
    assert server.answer(_request("GET", "/admin/state", b""), b"")[0] == 503


# -- 4. through a real mitmdump ---------------------------------------------------------------------------------------


class WeightInfoUpstream(ScriptedUpstream):
    """The scripted vLLM in dev mode: it also answers GET /weight_info."""

    weight_version = "w0"

    def start(self) -> str:
        if self._server is None:
            up = self

            class Handler(_Handler):
                upstream = up

                def do_GET(self) -> None:
                    if self.path.split("?")[0] == "/weight_info":
                        self._record(None)
                        return self._send_json(200, {"weight_version": up.weight_version})
                    return super().do_GET()

            self._serve(_Server, Handler, "scripted-upstream-dev")
        return self.base_url


@pytest.fixture(scope="module")
def dev_upstream(tokenizer_dir):
    with WeightInfoUpstream(tokenizer_dir) as up:
        yield up


@pytest.fixture(scope="module")
def gateway(dev_upstream, tmp_path_factory):
    base = tmp_path_factory.mktemp("control")
    with start_gateway(dev_upstream.base_url, str(base / "run"), str(base / "flows")) as gw:
        yield gw


@pytest.fixture
def gw(gateway, dev_upstream):
    dev_upstream.reset()
    gateway.mark()
    yield gateway
    admin(gateway, "POST", "/admin/release")  # never leave the shared gateway held
    dev_upstream.reset()


def admin(gw, method: str, path: str, body: dict | None = None, token: str | None = "file") -> httpx.Response:
    headers = {}
    if token == "file":
        with open(gw.state["control_token"]) as fh:
            headers["x-polar-control-token"] = fh.read().strip()
    elif token is not None:
        headers["x-polar-control-token"] = token
    with httpx.Client(trust_env=False, timeout=10) as client:
        return client.request(method, gw.state["control_url"] + path, headers=headers,
                              content=json.dumps(body).encode() if body is not None else None)


def chat(gw, results: list, stream: bool = True, session: str = "control") -> None:
    """One agent call through the proxy; appends (status, body)."""
    with gw.http_client(session, timeout=60) as client:
        resp = client.post(CHAT, json={"model": "m", "stream": stream, "max_tokens": 8,
                                       "messages": [{"role": "user", "content": "hi"}]},
                           headers={"authorization": "Bearer sk-test"})
        results.append((resp.status_code, resp.content))


def in_thread(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


@pytest.mark.integration
def test_4_1_the_control_endpoints_have_their_own_loopback_port_and_need_the_token(gw):
    url = httpx.URL(gw.state["control_url"])
    assert url.host == "127.0.0.1" and url.port not in (None, gw.port)
    assert stat.S_IMODE(os.stat(gw.state["control_token"]).st_mode) == 0o600
    assert admin(gw, "GET", "/admin/state", token=None).status_code == 401
    assert admin(gw, "POST", "/admin/hold", token="wrong").status_code == 403
    state = admin(gw, "GET", "/admin/state").json()
    assert state["held"] is False and "weight_version" in state
    # The agent-facing port does not serve them: a hold sent through the proxy holds nothing.
    with httpx.Client(proxy=f"http://127.0.0.1:{gw.port}", trust_env=False, timeout=10) as client:
        client.post("http://polar.gateway/admin/hold", headers={"x-polar-control-token": "x"})
    assert admin(gw, "GET", "/admin/state").json()["held"] is False


@pytest.mark.integration
def test_4_2_a_held_request_waits_before_the_backend_then_goes_with_the_released_version(gw, dev_upstream):
    assert admin(gw, "POST", "/admin/hold").json()["held"] is True
    results: list = []
    agent = in_thread(chat, gw, results)
    assert wait_for(lambda: admin(gw, "GET", "/admin/state").json()["waiting"] == 1, timeout=30)
    assert dev_upstream.chat_requests == [] and results == []  # the backend has not seen it
    released = admin(gw, "POST", "/admin/release", {"weight_version": "step-1"}).json()
    assert released["held"] is False and released["weight_version"] == "step-1"
    agent.join(60)
    assert results and results[0][0] == 200 and b"[DONE]" in results[0][1]
    (record,) = gw.records()
    assert record["weight_version"] == "step-1" and record["error"] is None


@pytest.mark.integration
def test_4_3_a_stream_already_sent_finishes_while_held_and_counts_in_flight(gw, dev_upstream):
    dev_upstream.script(Reply(text="one two three four", gate=True))
    results: list = []
    agent = in_thread(chat, gw, results)
    assert dev_upstream.wait_for_gate(30)
    state = admin(gw, "POST", "/admin/hold").json()
    assert state["held"] is True and state["in_flight"] == 1
    dev_upstream.release()
    agent.join(60)
    assert results and results[0][0] == 200 and b"[DONE]" in results[0][1]
    assert wait_for(lambda: admin(gw, "GET", "/admin/state").json()["in_flight"] == 0, timeout=10)
    assert admin(gw, "GET", "/admin/state").json()["held"] is True  # still held: finishing does not release


@pytest.mark.integration
def test_4_4_records_carry_the_backends_weight_info_version_until_a_release_names_another(tmp_path, tokenizer_dir):
    # A fresh gateway: the first call's probe reads GET /weight_info (vLLM dev mode).
    with WeightInfoUpstream(tokenizer_dir) as up, \
            start_gateway(up.base_url, str(tmp_path / "run"), str(tmp_path / "flows")) as fresh:
        results: list = []
        chat(fresh, results, stream=False)
        assert admin(fresh, "POST", "/admin/release", {"weight_version": "7"}).status_code == 200
        chat(fresh, results)
        assert [s for s, _ in results] == [200, 200]
        assert [r["weight_version"] for r in fresh.records()] == ["w0", "7"]
        assert any(r.path == "/weight_info" for r in up.requests)


# -- 5. a hold nobody releases ----------------------------------------------------------------------------------------


@pytest.mark.integration
def test_5_1_a_hold_expires_after_polar_hold_timeout_logged_and_held_requests_go(tmp_path, tokenizer_dir):
    # A backend without /weight_info (not dev mode): records carry no version until a release names one.
    with ScriptedUpstream(tokenizer_dir) as up, \
            start_gateway(up.base_url, str(tmp_path / "run"), str(tmp_path / "flows"),
                          sets=["polar_hold_timeout=2"]) as short:
        assert admin(short, "POST", "/admin/hold").json()["held"] is True  # then the "reloader" is gone
        results: list = []
        chat(short, results)  # waits for the expiry, then is served
        assert results[0][0] == 200 and b"[DONE]" in results[0][1]
        state = admin(short, "GET", "/admin/state").json()
        assert state["held"] is False and state["expired"] == 1
        (record,) = short.records()
        assert record["weight_version"] is None and record["error"] is None
        assert "hold expired" in short.log_text()
