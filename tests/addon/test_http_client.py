"""upstream.StreamClient — the lean HTTP/1.1 client of the streamed chat call, against a raw-socket server.

Scenarios: chunked bodies under arbitrary re-chunking of the wire bytes, keep-alive reuse, a stale idle connection
retried once, and every broken response raising the httpx exception the call driver already classifies.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.addon.http_client import StreamClient

pytestmark = pytest.mark.unit


def chunked(pieces: list[bytes], trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n" + trailer + b"\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class WireServer:
    """Answers each request on a connection with the next scripted reply: a list of raw byte writes (None closes)."""

    def __init__(self, replies: list[list[bytes | None]]):
        self.replies = list(replies)
        self.requests: list[bytes] = []
        self.connections = 0
        self.scripted_close = asyncio.Event()  # set once a reply's None has closed its connection

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader, writer):
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                for piece in self.replies.pop(0):
                    if piece is None:
                        writer.close()
                        await writer.wait_closed()
                        self.scripted_close.set()
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def stop(self):
        self.server.close()


async def call(client: StreamClient, base: str, body: bytes = b'{"x":1}') -> tuple[int, bytes, object]:
    resp = await client.send(client.build_request("POST", f"{base}/chat/completions", content=body,
                                                  headers={"x-extra": "1"}))
    try:
        data = b"".join([piece async for piece in resp.aiter_raw()])
    finally:
        await resp.aclose()
    return resp.status_code, data, resp


def run(coro):
    return asyncio.run(coro)


@settings(max_examples=40, deadline=None)
@given(pieces=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=8),
       cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12),
       trailer=st.sampled_from([b"", b"x-trailer: 1\r\n"]))
def test_1_1_chunked_bodies_decode_under_any_rechunking(pieces, cuts, trailer):
    wire = HEAD + chunked(pieces, trailer)
    writes, start = [], 0
    for cut in sorted(set(cuts)):
        if start < cut < len(wire):
            writes.append(wire[start:cut])
            start = cut
    writes.append(wire[start:])

    async def go():
        server = WireServer([writes, [HEAD + chunked([b"again"])]])
        base = await server.start()
        client = StreamClient(base, {"content-type": "application/json"}, 5)
        status, data, _ = await call(client, base)
        status2, data2, _ = await call(client, base)
        await client.aclose()
        await server.stop()
        return status, data, status2, data2, server

    status, data, status2, data2, server = run(go())
    assert (status, data) == (200, b"".join(pieces))
    assert (status2, data2) == (200, b"again")
    assert server.connections == 1  # the connection went back to the pool and was reused
    assert b"x-extra: 1\r\n" in server.requests[0] and b"content-length: 7\r\n" in server.requests[0]


def test_2_1_content_length_and_error_status_bodies():
    body = b'{"error":{"message":"nope"}}'

    async def go():
        server = WireServer([[b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(body), body]])
        base = await server.start()
        client = StreamClient(base, {}, 5)
        resp = await client.send(client.build_request("POST", f"{base}/chat/completions", content=b"{}"))
        data = await resp.aread()
        await resp.aclose()
        await server.stop()
        return resp.status_code, data

    assert run(go()) == (400, body)


def test_2_2_a_stale_idle_connection_is_retried_once_on_a_new_one():
    async def go():
        # First connection: one answer, then the server closes it while it sits idle in the pool.
        server = WireServer([[HEAD + chunked([b"one"]), None], [HEAD + chunked([b"two"])]])
        base = await server.start()
        client = StreamClient(base, {}, 5)
        first = await call(client, base)
        # the pooled connection is stale for sure: the server has closed it (an event, not a pause)
        await asyncio.wait_for(server.scripted_close.wait(), 10)
        second = await call(client, base)
        await server.stop()
        return first[:2], second[:2], server.connections

    assert run(go()) == ((200, b"one"), (200, b"two"), 2)


@pytest.mark.parametrize("replies,error", [
    ([[None]], httpx.RemoteProtocolError),  # closed before any response byte (fresh connection)
    ([[b"HTTP/1.1 200 OK\r\ntransfer-en", None]], httpx.RemoteProtocolError),  # torn head
    ([[b"garbage that is not http\r\n\r\n"]], httpx.RemoteProtocolError),
    ([[HEAD + b"5\r\nab", None]], httpx.RemoteProtocolError),  # mid-stream loss
    ([[HEAD + b"zz\r\n"]], httpx.RemoteProtocolError),  # bad chunk size
], ids=["closed", "torn_head", "garbage", "mid_stream_loss", "bad_chunk_size"])
def test_3_1_broken_responses_raise_the_httpx_errors_the_driver_classifies(replies, error):
    async def go():
        server = WireServer(replies)
        base = await server.start()
        client = StreamClient(base, {}, 5)
        try:
            with pytest.raises(error):
                await asyncio.wait_for(call(client, base), 5)
        finally:
            await server.stop()

    run(go())


def test_3_2_refused_connection_is_a_connect_error():
    async def go():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        client = StreamClient(f"http://127.0.0.1:{port}/v1", {}, 5)
        with pytest.raises(httpx.ConnectError):
            await call(client, f"http://127.0.0.1:{port}/v1")

    run(go())


def test_3_3_only_plain_http_urls():
    with pytest.raises(ValueError):
        StreamClient("https://example.com/v1", {}, 5)
