"""Backend faults through the real proxy (mitmdump, real TLS), for each of the four protocols.

Every fault gets the answer of the error table in docs/architecture.md (before headers: the provider's error status and
body; mid-stream: the protocol's error event), the record says what happened (`error.stage`, `error.status`,
`provider_status`), and the proxy answers the next call normally.

Scenarios: 1.x faults of a live backend (scripted upstream) · 2.x timeouts (a gateway with short timeouts) ·
3.x a backend that is not there (refused, then back; connect timeout on a socket that never accepts).
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from polar import records as rec
from tests.reliability import PROTOCOLS, Protocol, json_ok, stream_ending
from tests.support.gateway import start_gateway
from tests.support.records import one_record as only_record
from tests.support.scripted_upstream import Reply, ScriptedUpstream
from tests.support.servers import free_port

pytestmark = pytest.mark.integration

LONG = "one two three four five six seven eight nine ten eleven twelve"
# Time in these tests is an ordering against a known delay, never a speed (each record's error stage names the cause):
# the agent's own patience: a gateway that waited longer than this would have failed the call with a client timeout
CLIENT_TIMEOUT_S = 30.0
# 2.1: the backend's first byte comes this late; an error answer before it came from the gateway's 1 s timeout
SLOW_FIRST_BYTE_S = 4.0
# 2.2: a first byte this late is within the 1 s timeout, and the answer cannot come before it
SERVED_SLOW_FIRST_BYTE_S = 0.3
# 3.1: the absent backend's connect timeout; a refused connection is answered before it could have fired
ABSENT_CONNECT_TIMEOUT_S = 10.0
# 3.3: the black hole's connect timeout; the answer waits it out (less 20 %: a timer's coarse clock)
BLACKHOLE_CONNECT_TIMEOUT_S = 0.5
IDS = [p.name for p in PROTOCOLS]


def call(gw, proto: Protocol, stream: bool, text: str = "hi", session: str = "fault-session"):
    """One agent call through the proxy: (status, body bytes, seconds)."""
    t0 = time.monotonic()
    with gw.http_client(session=session, timeout=CLIENT_TIMEOUT_S) as client:
        resp = client.post(proto.url(stream), json=proto.body(stream, text),
                           headers={"authorization": "Bearer sk-fault", "x-api-key": "sk-fault"})
    return resp.status_code, resp.content, time.monotonic() - t0


def assert_error(proto: Protocol, status: int, raw: bytes, kind: str) -> None:
    want_status, want_label = proto.errors[kind]
    assert status == want_status, (status, raw[:300])
    assert proto.error_ok(status, raw) and proto.label(json.loads(raw)) == want_label, raw[:300]


def assert_served(gw, proto: Protocol) -> None:
    """The proxy answers the next call in full, and records it without error."""
    before = {r["id"] for r in gw.records()}
    status, raw, _ = call(gw, proto, True, "next call")
    assert status == 200 and stream_ending(proto, raw) == "ok", raw[-300:]
    new = [r for r in gw.records() if r["id"] not in before]
    assert len(new) == 1 and new[0]["error"] is None and new[0]["provider_status"] == 200


# -- 1. faults of a live backend ------------------------------------------------------------------------------------

# (id, fault, agent streams?, gateway error kind, record stage, record error.status)
BEFORE_HEADERS = [
    ("503", "status:503", True, "unavailable", "backend_status", 503),
    ("429", "status:429", True, "rate_limited", "backend_status", 429),
    ("400", "status:400", False, "bad_request", "backend_status", 400),
    ("500_without_body", "status:500-nobody", True, "unavailable", "backend_status", 500),
    ("503_without_body_json_agent", "status:503-nobody", False, "unavailable", "backend_status", 503),
    ("garbage_sse", "garbage", True, "unavailable", "backend_stream", None),
    ("garbage_json_agent", "garbage", False, "unavailable", "backend_stream", None),
    ("closed_before_first_event", "disconnect_after:0", True, "unavailable", "backend_stream", None),
    ("disconnect_json_agent", "disconnect_after:3", False, "unavailable", "backend_stream", None),
]


@pytest.mark.parametrize("proto", PROTOCOLS, ids=IDS)
@pytest.mark.parametrize(("fault", "stream", "kind", "stage", "err_status"),
                         [c[1:] for c in BEFORE_HEADERS], ids=[c[0] for c in BEFORE_HEADERS])
def test_1_1_fault_before_headers_is_the_tables_error(gateway, upstream, proto, fault, stream, kind, stage,
                                                      err_status):
    upstream.script(Reply(text=LONG, fault=fault))
    status, raw, _ = call(gateway, proto, stream)
    assert_error(proto, status, raw, kind)
    r = only_record(gateway)
    assert r["protocol"] == proto.name and r["session"] == "fault-session"
    assert r["error"]["stage"] == stage and r["error"]["status"] == err_status, r["error"]
    assert r["provider_status"] == status and r["upstream_request"] is not None
    assert_served(gateway, proto)


@pytest.mark.parametrize("proto", PROTOCOLS, ids=IDS)
def test_1_2_disconnect_mid_stream_is_the_protocols_error_event(gateway, upstream, proto):
    upstream.script(Reply(text=LONG, fault="disconnect_after:3"))
    status, raw, _ = call(gateway, proto, True)
    assert status == 200 and stream_ending(proto, raw) == "error", raw[-400:]
    r = only_record(gateway)
    assert r["error"]["stage"] == "backend_stream" and r["provider_status"] == 200
    # What did arrive is kept: a non-empty prefix of what the backend generated, nothing invented.
    truth = upstream.responses[-1]
    got = rec.token_ids(r, "completion_token_ids")
    assert got and got == truth.completion_ids[:len(got)] and len(got) < len(truth.completion_ids)
    assert rec.token_ids(r, "prompt_token_ids") == truth.prompt_token_ids
    assert_served(gateway, proto)


@pytest.mark.parametrize("proto", PROTOCOLS, ids=IDS)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_1_3_missing_token_ids_answers_and_the_record_says_so(gateway, upstream, proto, stream):
    upstream.script(Reply(text=LONG, fault="no_token_ids"))
    status, raw, _ = call(gateway, proto, stream)
    assert status == 200 and (stream_ending(proto, raw) == "ok" if stream else json_ok(proto, raw))
    r = only_record(gateway)
    assert r["error"] is None
    assert r["prompt_token_ids"] is None and r["completion_token_ids"] is None  # nil = the backend gave none
    assert "backend_gave_no_token_ids" in r["normalizations"]
    assert r["usage"]["completion_tokens"] == len(upstream.responses[-1].completion_ids)


@pytest.mark.parametrize("proto", PROTOCOLS, ids=IDS)
def test_1_4_missing_logprobs_answers_and_the_record_has_none(gateway, upstream, proto):
    upstream.script(Reply(text=LONG, fault="no_logprobs"))
    status, raw, _ = call(gateway, proto, True)
    assert status == 200 and stream_ending(proto, raw) == "ok"
    r = only_record(gateway)
    assert r["error"] is None and r["completion_logprobs"] is None
    assert rec.token_ids(r, "completion_token_ids") == upstream.responses[-1].completion_ids


# -- 2. timeouts ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fast_gateway(_upstream_server, tmp_path_factory):
    """The same scripted upstream behind a gateway with a 1 s first-byte timeout."""
    base = tmp_path_factory.mktemp("fast")
    with start_gateway(_upstream_server.base_url, str(base / "run"), str(base / "flows"),
                       sets=["polar_first_byte_timeout=1", "polar_idle_timeout=1", "polar_connect_timeout=2"]) as gw:
        yield gw


@pytest.mark.parametrize("proto", PROTOCOLS, ids=IDS)
@pytest.mark.parametrize("fault", [f"slow_first_byte:{SLOW_FIRST_BYTE_S:g}", "hang"])
def test_2_1_no_first_byte_within_the_timeout_is_unavailable(fast_gateway, upstream, proto, fault):
    fast_gateway.mark()
    upstream.script(Reply(text=LONG, fault=fault))
    status, raw, seconds = call(fast_gateway, proto, True)
    assert_error(proto, status, raw, "unavailable")
    assert seconds < SLOW_FIRST_BYTE_S  # before the backend's first byte: the gateway's timeout answered
    r = only_record(fast_gateway)
    assert r["error"]["stage"] == "backend_timeout" and r["provider_status"] == status
    upstream.reset()  # release the parked upstream thread
    assert_served(fast_gateway, proto)


@pytest.mark.parametrize("proto", PROTOCOLS, ids=IDS)
def test_2_3_a_backend_that_stalls_mid_stream_ends_in_the_protocols_error_event(fast_gateway, upstream, proto):
    fast_gateway.mark()
    upstream.script(Reply(text=LONG, gate=True))  # the upstream parks after its first content chunk
    try:
        status, raw, _ = call(fast_gateway, proto, True)
    finally:
        upstream.release()
    assert status == 200 and stream_ending(proto, raw) == "error", raw[-400:]
    r = only_record(fast_gateway)
    assert r["error"]["stage"] == "backend_timeout" and r["provider_status"] == 200
    got = rec.token_ids(r, "completion_token_ids")
    assert got and got == upstream.responses[-1].completion_ids[:len(got)]
    assert_served(fast_gateway, proto)


@pytest.mark.parametrize("proto", PROTOCOLS, ids=IDS)
def test_2_2_a_slow_first_byte_within_the_timeout_is_served(fast_gateway, upstream, proto):
    fast_gateway.mark()
    upstream.script(Reply(text=LONG, fault=f"slow_first_byte:{SERVED_SLOW_FIRST_BYTE_S:g}"))
    status, raw, seconds = call(fast_gateway, proto, True)
    # served after the late first byte (the fault ran), not cut by the 1 s first-byte timeout
    assert status == 200 and stream_ending(proto, raw) == "ok" and seconds >= SERVED_SLOW_FIRST_BYTE_S
    assert only_record(fast_gateway)["error"] is None


# -- 3. a backend that is not there ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def absent_backend(_upstream_server, tmp_path_factory):
    """A gateway whose upstream port has nobody listening; `.revive()` starts a scripted upstream there."""
    port = free_port()
    base = tmp_path_factory.mktemp("absent")
    with start_gateway(f"http://127.0.0.1:{port}/v1", str(base / "run"), str(base / "flows"),
                       sets=[f"polar_connect_timeout={ABSENT_CONNECT_TIMEOUT_S:g}"]) as gw:
        gw.revived = ScriptedUpstream(_upstream_server.tokenizer, port=port)
        yield gw
        gw.revived.stop()


@pytest.fixture(scope="module")
def blackhole_gateway(tmp_path_factory):
    """A gateway whose upstream is a listening socket with a full accept queue: SYNs are dropped, connects hang."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    port = sock.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))  # takes the only queue slot; nobody accepts
    base = tmp_path_factory.mktemp("blackhole")
    with start_gateway(f"http://127.0.0.1:{port}/v1", str(base / "run"), str(base / "flows"),
                       sets=[f"polar_connect_timeout={BLACKHOLE_CONNECT_TIMEOUT_S:g}"]) as gw:
        yield gw
    filler.close()
    sock.close()


@pytest.mark.parametrize("proto", PROTOCOLS, ids=IDS)
def test_3_1_refused_connection_is_unavailable_and_recorded(absent_backend, proto):
    absent_backend.mark()
    for stream in (True, False):
        status, raw, seconds = call(absent_backend, proto, stream)
        assert_error(proto, status, raw, "unavailable")
        assert seconds < ABSENT_CONNECT_TIMEOUT_S  # refused is final at once: not waited out, not retried
    records = absent_backend.records()
    assert len(records) == 2 and all(r["error"]["stage"] == "backend_connect" for r in records)
    assert all(r["protocol"] == proto.name and r["provider_status"] == status for r in records)


def test_3_2_backend_that_comes_back_is_served(absent_backend):
    """After refused connections the model is resolved again: once the backend listens, calls are answered."""
    up = absent_backend.revived
    up.start()
    try:
        for proto in PROTOCOLS:
            absent_backend.mark()
            assert_served(absent_backend, proto)
    finally:
        up.stop()


@pytest.mark.parametrize("proto", PROTOCOLS, ids=IDS)
def test_3_3_connect_timeout_is_unavailable_and_recorded(blackhole_gateway, proto):
    blackhole_gateway.mark()
    status, raw, seconds = call(blackhole_gateway, proto, True)
    assert_error(proto, status, raw, "unavailable")
    # the connect timeout ended it: waited out (a timer may fire a little early), and well before the agent gave up
    assert BLACKHOLE_CONNECT_TIMEOUT_S * 0.8 < seconds < CLIENT_TIMEOUT_S
    r = only_record(blackhole_gateway)
    assert r["error"]["stage"] == "backend_timeout" and r["provider_status"] == status
