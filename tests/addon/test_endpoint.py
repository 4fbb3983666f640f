"""addon/endpoint.py — the gateway's HTTP/1.1 endpoint as the diverted path uses it: only connections the gateway
handed over are served (an unknown peer is closed without a byte), the agent's own requests are parsed here
(keep-alive, `Expect: 100-continue`, the body cap with its provider-shaped 413 and a clean close), and malformed
HTTP gets a 4xx. 1.x run an Endpoint in-process on loopback; 2.x go through the real proxy (mitmdump, real TLS).

Scenarios: 1.1–1.3 handoff · 1.4 keep-alive · 1.5 100-continue · 1.6–1.7 body cap · 1.8 malformed ·
2.x the diverted path through mitmdump; 2.1, 2.2 and 2.4 once more on the request-hook path (`reroute`, see
tests/conftest.py; with POLAR_TEST_DIVERT=0 every test takes it).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import time
import urllib.request

import h11
import pytest

from polar.addon.endpoint import Endpoint, Handoff, Request, Responder

HANDOFF = Handoff(conn_id="agent-1", conn_user="sess", host="api.anthropic.com", port=443)
# Deadlines, not speeds: each bounds a wait whose outcome is decided by an ordering, so it is generous (a loaded
# 2-core CI machine) and only turns a hang into a failure.
WAIT_DEADLINE_S = 10.0
# 1.2: the handoff wait an unknown peer would get; closed before it ends, it was closed at its first bytes.
SLOW_HANDOFF_WAIT_S = 30.0


class Served:
    """The handler: records each request, answers 200 with the body's length."""

    def __init__(self):
        self.requests: list[Request] = []

    async def __call__(self, request: Request, responder: Responder) -> None:
        self.requests.append(request)
        await responder.respond(200, [("content-type", "application/json")],
                                json.dumps({"n": len(request.body)}).encode())


async def _endpoint(**kw) -> tuple[Endpoint, Served]:
    served = Served()
    ep = Endpoint(served, **kw)
    await ep.start()
    return ep, served


async def _connect(ep: Endpoint, hand: Handoff | None, before_accept: bool = True):
    """A client connection to the endpoint; handed over before it connects, after the endpoint accepted it, or not."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    if hand is not None and before_accept:
        ep.hand(sock.getsockname(), hand)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", ep.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    if hand is not None and not before_accept:
        await _until_waiting(ep, sock.getsockname())  # the endpoint has accepted and waits for the handoff
        ep.hand(sock.getsockname(), hand)
    return reader, writer


async def _until_waiting(ep: Endpoint, peer) -> None:
    """Poll until the endpoint has accepted `peer` and parked it waiting for its handoff (the path under test)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_DEADLINE_S
    while (peer[0], peer[1]) not in ep._waiting:
        assert loop.time() < deadline, "the endpoint never waited for a handoff"
        await asyncio.sleep(0.005)


async def _response(reader: asyncio.StreamReader, conn: h11.Connection) -> tuple[h11.Response, bytes]:
    head, body = None, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await asyncio.wait_for(reader.read(65536), 5))
        elif isinstance(event, h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return head, body


def _post(conn: h11.Connection, body: bytes, headers: list | None = None) -> bytes:
    hdrs = [("host", "api.anthropic.com"), ("content-length", str(len(body))), *(headers or [])]
    return (conn.send(h11.Request(method="POST", target="/v1/messages?key=AIza", headers=hdrs))
            + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))


@pytest.mark.unit
@pytest.mark.parametrize("before_accept", [True, False])
def test_1_1_a_handed_connection_is_served_with_its_handoff(before_accept):
    async def main():
        ep, served = await _endpoint()
        reader, writer = await _connect(ep, HANDOFF, before_accept)
        conn = h11.Connection(h11.CLIENT)
        writer.write(_post(conn, b'{"a":1}', [("X-Api-Key", "sk-secret")]))
        head, body = await _response(reader, conn)
        writer.close()
        await ep.stop()
        return head, body, served

    head, body, served = asyncio.run(main())
    assert head.status_code == 200 and json.loads(body) == {"n": 7}
    (req,) = served.requests
    assert req.handoff == HANDOFF and req.method == "POST" and req.target == "/v1/messages?key=AIza"
    assert (b"X-Api-Key", b"sk-secret") in req.headers  # as sent, name case kept
    assert req.body == b'{"a":1}' and req.too_large is False


@pytest.mark.unit
def test_1_2_an_unknown_peer_is_closed_without_a_byte_at_its_first_bytes(caplog):
    async def main():
        ep, served = await _endpoint()
        ep.handoff_wait = SLOW_HANDOFF_WAIT_S  # not the timeout: its first bytes end it
        reader, writer = await _connect(ep, None)
        t = time.monotonic()
        writer.write(_post(h11.Connection(h11.CLIENT), b"{}"))
        got = await asyncio.wait_for(reader.read(), WAIT_DEADLINE_S)
        elapsed = time.monotonic() - t
        await ep.stop()
        return got, elapsed, served

    got, elapsed, served = asyncio.run(main())
    # closed before the handoff wait could have ended it: by its first bytes (an ordering, not a speed)
    assert got == b"" and elapsed < SLOW_HANDOFF_WAIT_S and served.requests == []
    assert any("did not hand over" in r.getMessage() for r in caplog.records)


@pytest.mark.unit
def test_1_3_a_silent_unknown_peer_is_closed_after_the_handoff_wait():
    async def main():
        ep, served = await _endpoint()
        ep.handoff_wait = 0.2
        reader, writer = await _connect(ep, None)
        got = await asyncio.wait_for(reader.read(), 5)
        ep.hand(writer.get_extra_info("sockname"), HANDOFF)  # too late: never claimed by that connection
        await ep.stop()
        return got, served

    got, served = asyncio.run(main())
    assert got == b"" and served.requests == []


@pytest.mark.unit
def test_1_4_keep_alive_serves_several_calls_on_one_connection():
    async def main():
        ep, served = await _endpoint()
        reader, writer = await _connect(ep, HANDOFF)
        conn = h11.Connection(h11.CLIENT)
        statuses = []
        for i in range(5):
            writer.write(_post(conn, b"x" * i))
            head, body = await _response(reader, conn)
            statuses.append((head.status_code, json.loads(body)["n"]))
            conn.start_next_cycle()
        writer.close()
        await ep.stop()
        return statuses, served

    statuses, served = asyncio.run(main())
    assert statuses == [(200, i) for i in range(5)] and len(served.requests) == 5


@pytest.mark.unit
def test_1_5_expect_100_continue_is_answered_before_the_body_is_sent():
    async def main():
        ep, served = await _endpoint()
        reader, writer = await _connect(ep, HANDOFF)
        body = b"y" * 200_000
        writer.write(b"POST /v1/messages HTTP/1.1\r\nhost: api.anthropic.com\r\nexpect: 100-continue\r\n"
                     b"content-length: %d\r\n\r\n" % len(body))
        # The interim is read BEFORE a byte of the body is sent: an endpoint that waits for the body (the stall
        # curl would sit out for 1 s) never answers, and the deadline turns that into a failure.
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_DEADLINE_S)
        writer.write(body)
        final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_DEADLINE_S)
        writer.close()
        await ep.stop()
        return interim, final, served

    interim, final, served = asyncio.run(main())
    assert interim.startswith(b"HTTP/1.1 100 ")
    assert final.startswith(b"HTTP/1.1 200 ") and len(served.requests[0].body) == 200_000


@pytest.mark.unit
@pytest.mark.parametrize("chunked", [False, True])
def test_1_6_a_body_over_the_cap_is_answered_early_drained_and_the_connection_closed(chunked):
    async def main():
        ep, served = await _endpoint(body_cap=lambda: 100_000)
        reader, writer = await _connect(ep, HANDOFF)
        body = b"z" * 1_000_000
        if chunked:
            head = b"POST /v1/messages HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n"
            wire = head + b"".join(b"%x\r\n%s\r\n" % (50_000, body[i:i + 50_000])
                                   for i in range(0, len(body), 50_000)) + b"0\r\n\r\n"
        else:
            wire = b"POST /v1/messages HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        writer.write(wire)
        await writer.drain()  # every byte is read by the endpoint: no reset under its answer
        rest = await asyncio.wait_for(reader.read(), 5)  # the answer, then EOF
        await ep.stop()
        return rest, served

    rest, served = asyncio.run(main())
    head = rest.split(b"\r\n\r\n", 1)[0].lower()
    assert rest.startswith(b"HTTP/1.1 200 ") and b"connection: close" in head
    (req,) = served.requests
    assert req.too_large is True and 100_000 < len(req.body) < 1_000_000


@pytest.mark.unit
def test_1_7_no_cap_or_a_body_within_it_keeps_the_connection():
    async def main():
        ep, served = await _endpoint(body_cap=lambda: 10)
        reader, writer = await _connect(ep, HANDOFF)
        conn = h11.Connection(h11.CLIENT)
        writer.write(_post(conn, b"0123456789"))  # exactly the cap
        head, _ = await _response(reader, conn)
        conn.start_next_cycle()
        writer.write(_post(conn, b"ok"))
        head2, _ = await _response(reader, conn)
        writer.close()
        await ep.stop()
        return head, head2, served

    head, head2, served = asyncio.run(main())
    assert head.status_code == head2.status_code == 200
    assert [r.too_large for r in served.requests] == [False, False]


@pytest.mark.unit
def test_1_8_malformed_http_is_a_json_400_and_a_close():
    async def main():
        ep, served = await _endpoint()
        reader, writer = await _connect(ep, HANDOFF)
        writer.write(b"POST /v1/messages HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n")
        got = await asyncio.wait_for(reader.read(), 5)
        await ep.stop()
        return got, served

    got, served = asyncio.run(main())
    assert got.startswith(b"HTTP/1.1 400 ") and b"invalid_request_error" in got and served.requests == []


# -- 2. through the real proxy ------------------------------------------------------------------------------------


def _ready(gateway) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{gateway.port}"}))
    with opener.open("http://polar.gateway/ready", timeout=5) as resp:
        return json.loads(resp.read())


def _tunnel(gateway, host: str = "api.anthropic.com") -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    raw.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n"
                "Proxy-Authorization: Basic ZW5kcG9pbnQtdGVzdDp4\r\n\r\n".encode())  # endpoint-test:x
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head
    return ssl.create_default_context(cafile=gateway.ca_pem).wrap_socket(raw, server_hostname=host)


def _read_head(tls: ssl.SSLSocket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        assert chunk, data
        data += chunk
    return data


@pytest.mark.integration
@pytest.mark.reroute
def test_2_1_provider_calls_take_the_diverted_path_and_only_it(gateway, upstream):
    before = _ready(gateway)["served"]
    with gateway.http_client(timeout=30) as client:
        for _ in range(2):
            r = client.post("https://api.anthropic.com/v1/messages", headers={"x-api-key": "k"},
                            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200
    after = _ready(gateway)["served"]
    grown = {k: after[k] - before[k] for k in after}
    # No HTTPFlow for diverted calls: a mitmproxy change that silently fell back to the slow path shows here.
    assert grown == ({"diverted": 2, "rerouted": 0, "base_url": 0, "base_url_refused": 0} if gateway.divert
                     else {"diverted": 0, "rerouted": 2, "base_url": 0, "base_url_refused": 0})
    (rec, _) = gateway.records()[-2:]
    assert rec["session"] == "test-session" and rec["host"] == "api.anthropic.com"


@pytest.mark.integration
@pytest.mark.reroute
def test_2_2_expect_100_continue_through_the_proxy_does_not_stall(gateway, upstream):
    body = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 30_000}]})
    tls = _tunnel(gateway)
    try:
        tls.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\nx-api-key: k\r\n"
                    b"content-type: application/json\r\nExpect: 100-continue\r\n"
                    b"content-length: %d\r\n\r\n" % len(body))
        # read before the body is sent: no 100 from the path means no answer at all (the deadline fails it)
        tls.settimeout(WAIT_DEADLINE_S)
        interim = _read_head(tls)
        tls.sendall(body.encode())
        final = interim.split(b"\r\n\r\n", 1)[1] or _read_head(tls)
    finally:
        tls.close()
    assert interim.startswith(b"HTTP/1.1 100"), interim[:100]
    assert final.startswith(b"HTTP/1.1 200"), final[:200]
    (rec,) = gateway.records()
    assert rec["session"] == "endpoint-test" and not any(k.lower() == "expect" for k, _ in rec["request_headers"])


@pytest.mark.integration
def test_2_3_nobody_but_the_gateway_reaches_the_endpoint_port(gateway):
    ports = re.findall(r"polar gateway endpoint on 127\.0\.0\.1:(\d+)", gateway.log_text())
    assert ports
    with socket.create_connection(("127.0.0.1", int(ports[-1])), timeout=10) as s:
        s.sendall(b"POST /polar/x HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\n\r\n")
        assert s.recv(65536) == b""  # closed without an answer
    assert "did not hand over" in gateway.log_text()


@pytest.mark.integration
@pytest.mark.reroute
def test_2_4_websocket_upgrade_is_426_and_the_connection_serves_the_next_call(gateway, upstream):
    tls = _tunnel(gateway, "chatgpt.com")
    try:
        tls.sendall(b"GET /backend-api/codex/responses HTTP/1.1\r\nHost: chatgpt.com\r\nConnection: Upgrade\r\n"
                    b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZQ==\r\n\r\n")
        first = _read_head(tls)
        length = int(re.search(rb"(?i)content-length: (\d+)", first).group(1))
        rest = first.split(b"\r\n\r\n", 1)[1]
        while len(rest) < length:
            rest += tls.recv(65536)
        tls.sendall(b"GET /backend-api/codex/models HTTP/1.1\r\nHost: chatgpt.com\r\n\r\n")
        second = _read_head(tls)
    finally:
        tls.close()
    assert first.startswith(b"HTTP/1.1 426") and b"upgrade_required" in rest
    assert second.split(b"\r\n", 1)[0].split(b" ")[1] in (b"200", b"404")  # answered by the gateway, same connection
