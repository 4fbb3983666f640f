"""The gateway's own HTTP/1.1 endpoint on 127.0.0.1, served on mitmproxy's event loop.

Every byte the agent gets for a provider call is written here, so the gateway controls all of it: real incremental
streaming, provider-shaped errors for backend trouble before and after headers, and a record for every call
(docs/field-notes.md, mitmproxy 12: a plain request rewrite cannot shape a refused connection or a mid-stream loss).

Two kinds of connection reach it, both opened by mitmproxy and announced by the gateway before their first byte
(`hand`, keyed by mitmproxy's local address of the hop, which is the peer address seen here):
- a diverted provider tunnel (the default, `polar_divert`): mitmproxy terminates TLS and relays the agent's
  decrypted HTTP/1.1 unchanged, so this endpoint parses the agent's own requests — keep-alive, `Expect:
  100-continue` (mitmproxy used to answer it), and the body cap (`polar_max_body_mb`) while reading;
- a base-URL connection (addon/base_url.py): the agent's plain HTTP to the proxy port, relayed unchanged, each
  request admitted and mapped to its provider host by the gateway;
- the hop of a rerouted flow (the `request`-hook fallback): mitmproxy's HTTP client sends a token request
  `POST /polar/<flow id>` and relays our answer as a stream.
A connection nobody handed over (any other local process) is closed without a byte.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import h11

log = logging.getLogger("polar.endpoint")

Address = tuple[str, int]


class ClientGone(ConnectionError):
    """The peer (mitmproxy, i.e. the agent) closed the connection while we were answering."""


@dataclass(frozen=True)
class Handoff:
    """Who is behind one connection mitmproxy opens to the endpoint (the gateway says so in `server_connected`)."""

    conn_id: str  # the agent's connection (mitmproxy's client id)
    conn_user: str | None = None  # the proxy user name of that connection's CONNECT
    host: str | None = None  # a diverted tunnel: the CONNECT host (lower case) and port; None: a rerouted flow's hop
    port: int | None = None
    listen_port: int | None = None  # a base-URL connection: the proxy port the agent connected to

    @property
    def diverted(self) -> bool:
        return self.host is not None

    @property
    def base_url(self) -> bool:
        return self.listen_port is not None


@dataclass
class Request:
    """One request as read from a handed connection."""

    handoff: Handoff
    method: str
    target: str
    headers: list[tuple[bytes, bytes]]  # as sent: original name case and order
    body: bytes  # undecoded
    too_large: bool = False  # the body went past the cap: `body` is what was read until then, the rest is not


class Responder:
    """Writes one HTTP response: start() headers, send() body pieces, end().

    The head that start() builds leaves with the first send() or end(), in one write with that body piece: each
    write is one segment mitmproxy reads, relays and encrypts, so a streamed answer costs one relay fewer, and the
    bytes the agent gets are the same. The caller sends right after start() (call.py's relay does), so the head is
    not delayed.

    close: the connection ends after this response (`Connection: close` is sent), e.g. after a body that was not
    read to its end."""

    def __init__(self, conn: h11.Connection, writer: asyncio.StreamWriter, close: bool = False):
        self._conn = conn
        self._writer = writer
        self.close = close
        self.started = False
        self.status: int | None = None
        self.finished = False
        self._head = b""  # start()'s bytes, not written yet
        self._chunked = False  # h11 frames this body chunked: send() frames its pieces itself

    def _headers(self, headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
        hdrs = [(k.encode(), v.encode()) for k, v in headers]
        if self.close:
            hdrs.append((b"connection", b"close"))
        return hdrs

    async def _put(self, data: bytes) -> None:
        if self._head:
            data, self._head = self._head + data, b""
        if data:
            if self._writer.is_closing():
                raise ClientGone("connection closed")
            self._writer.write(data)
            try:
                await self._writer.drain()
            except (ConnectionError, OSError) as exc:
                raise ClientGone(str(exc)) from exc

    async def start(self, status: int, headers: list[tuple[str, str]], length: int | None = None) -> None:
        hdrs = self._headers(headers)
        if length is not None:
            hdrs.append((b"content-length", str(length).encode()))
        else:
            hdrs.append((b"transfer-encoding", b"chunked"))
        if self._writer.is_closing():  # an agent already gone is noticed here, as when the head was written here
            raise ClientGone("connection closed")
        self._head = self._conn.send(h11.Response(status_code=status, headers=hdrs)) or b""
        # h11 keeps no count of a chunked body, and its framing costs ~4 µs a piece: frame pieces here, the same
        # bytes (h11 drops chunking itself for an HTTP/1.0 agent, hence the check of what it wrote).
        self._chunked = b"\r\ntransfer-encoding: chunked\r\n" in self._head.lower()
        self.started = True
        self.status = status

    def _frame(self, data: bytes) -> bytes:
        if not data:
            return b""
        if self._chunked:
            return b"%x\r\n%s\r\n" % (len(data), data)  # h11's ChunkedWriter bytes
        return self._conn.send(h11.Data(data=data)) or b""

    async def send(self, data: bytes) -> None:
        """A body piece (with the head, if start()'s is still here; b"" then sends the head alone)."""
        await self._put(self._frame(data))

    async def end(self, *pieces: bytes) -> None:
        """The last body pieces (each framed as send() frames it) and the end of the body, in one write."""
        if not self.finished:
            self.finished = True
            last = [self._frame(piece) for piece in pieces]
            last.append(self._conn.send(h11.EndOfMessage()) or b"")
            await self._put(b"".join(last))

    def abort(self) -> None:
        """Close the connection without ending the body: the client sees a cut stream, never a complete answer."""
        self.finished = True
        if self._head and not self._writer.is_closing():
            self._writer.write(self._head)  # close() still sends what is buffered: the head, then the cut
        self._head = b""
        self._writer.close()

    async def respond(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """A whole response in one write (one segment for mitmproxy to read, one drain)."""
        hdrs = self._headers(headers)
        hdrs.append((b"content-length", str(len(body)).encode()))
        self.started = True
        self.status = status
        self.finished = True
        conn = self._conn
        data = conn.send(h11.Response(status_code=status, headers=hdrs))
        if body:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        if self._writer.is_closing():
            raise ClientGone("connection closed")
        self._writer.write(data)
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ClientGone(str(exc)) from exc


Handler = Callable[[Request, Responder], Awaitable[None]]

HANDOFF_WAIT_S = 5.0  # a hop's accept may run before the gateway's server_connected hook; its bytes never do
DRAIN_S = 10.0  # after a too-large body was answered: how long the rest is read and dropped before closing
READ_SIZE = 1 << 16


def _address(peer) -> Address | None:
    return (peer[0], peer[1]) if isinstance(peer, tuple) and len(peer) >= 2 else None


class Endpoint:
    def __init__(self, handler: Handler, body_cap: Callable[[], int | None] | None = None):
        self.handler = handler
        self.body_cap = body_cap  # the largest request body read, in bytes (None, or returning None: no cap)
        self.server: asyncio.AbstractServer | None = None
        self.port: int | None = None
        self.handoff_wait = HANDOFF_WAIT_S
        self.drain_s = DRAIN_S
        self._handed: dict[Address, Handoff] = {}
        self._waiting: dict[Address, asyncio.Future] = {}

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.server = await asyncio.start_server(self._serve, host, port, limit=1 << 20)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    # ------------------------------------------------------------------------------------------------ handoff

    def hand(self, peer, handoff: Handoff) -> None:
        """The connection from `peer` (mitmproxy's local address of a hop it just opened) belongs to `handoff`."""
        addr = _address(peer)
        if addr is None:
            return
        waiter = self._waiting.pop(addr, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(handoff)
        else:
            self._handed[addr] = handoff

    def release(self, peer) -> None:
        """Forget a handoff that was never claimed (the hop closed before the endpoint accepted it)."""
        addr = _address(peer)
        if addr is not None:
            self._handed.pop(addr, None)

    async def _wait_for_handoff(self, addr: Address, reader: asyncio.StreamReader
                                ) -> tuple[Handoff | None, asyncio.Task | None]:
        """A hop's accept can run before the gateway's server_connected hook, but mitmproxy writes nothing before
        that hook has run: wait for whichever comes first, the handoff (then the read started here is the
        connection's first) or the peer's first bytes or close (then nobody handed it over: closed at once)."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiting[addr] = waiter
        first = loop.create_task(reader.read(READ_SIZE))
        try:
            await asyncio.wait((waiter, first), timeout=self.handoff_wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self._waiting.get(addr) is waiter:
                del self._waiting[addr]
        if waiter.done() and not waiter.cancelled():
            return waiter.result(), first
        waiter.cancel()
        first.cancel()
        return None, None

    # ------------------------------------------------------------------------------------------------ serving

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn: h11.Connection | None = None
        first: asyncio.Task | None = None
        try:
            addr = _address(writer.get_extra_info("peername"))
            handoff = self._handed.pop(addr, None) if addr is not None else None
            if handoff is None and addr is not None:
                handoff, first = await self._wait_for_handoff(addr, reader)
            if handoff is None:
                log.warning("polar endpoint: closed a connection from %s that the gateway did not hand over", addr)
                return
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
            if first is not None:
                conn.receive_data(await first)
                first = None
            await self._requests(conn, reader, writer, handoff)
        except h11.RemoteProtocolError as exc:
            if conn is not None:
                await self._bad_request(conn, writer, exc)
            log.debug("endpoint connection ended: %s", exc)
        except (h11.LocalProtocolError, ConnectionError) as exc:
            log.debug("endpoint connection ended: %s", exc)
        finally:
            if first is not None:
                first.cancel()
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    async def _requests(self, conn: h11.Connection, reader, writer, handoff: Handoff) -> None:
        while True:
            event = await self._next_event(conn, reader)
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed: the agent (or mitmproxy) closed an idle keep-alive connection
            if conn.they_are_waiting_for_100_continue:
                writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            body, too_large = await self._read_body(conn, reader)
            if body is None:
                return  # closed in the middle of the body
            responder = Responder(conn, writer, close=too_large)
            try:
                await self.handler(Request(handoff, event.method.decode("ascii"),
                                           event.target.decode("utf-8", "surrogateescape"),
                                           event.headers.raw_items(), body, too_large), responder)
            except ClientGone:
                return
            if too_large:
                await self._drain(conn, reader)
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # MUST_CLOSE (Connection: close, HTTP/1.0), or the response was cut
            conn.start_next_cycle()

    @staticmethod
    async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(READ_SIZE))  # b"" is EOF
                continue
            return event

    async def _read_body(self, conn: h11.Connection, reader) -> tuple[bytes | None, bool]:
        """The request body; (body so far, True) as soon as it passes the cap, (None, False) on close."""
        cap = self.body_cap() if self.body_cap is not None else None
        parts: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event(conn, reader)
            if isinstance(event, h11.Data):
                parts.append(bytes(event.data))
                size += len(event.data)
                if cap is not None and size > cap:
                    return b"".join(parts), True
            elif isinstance(event, h11.EndOfMessage):
                return (b"".join(parts) if len(parts) != 1 else parts[0]), False
            else:
                return None, False

    async def _drain(self, conn: h11.Connection, reader) -> None:
        """Read and drop the rest of a body that was answered early, so that closing does not reset the connection
        under the answer; bounded by drain_s."""
        async def rest() -> None:
            while conn.their_state is h11.SEND_BODY:
                event = await self._next_event(conn, reader)
                if not isinstance(event, h11.Data):
                    return
        try:
            await asyncio.wait_for(rest(), self.drain_s)
        except (asyncio.TimeoutError, h11.RemoteProtocolError, ConnectionError):
            pass

    @staticmethod
    async def _bad_request(conn: h11.Connection, writer: asyncio.StreamWriter, exc: h11.RemoteProtocolError) -> None:
        """Malformed HTTP from the agent: a JSON 4xx (h11's hint: 400, or 431 for an oversized head), then close."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE) or writer.is_closing():
            return
        body = b'{"error":{"message":"malformed HTTP request","type":"invalid_request_error"}}'
        try:
            data = conn.send(h11.Response(status_code=exc.error_status_hint, headers=[
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close")]))
            writer.write(data + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
            await writer.drain()
        except (h11.LocalProtocolError, ConnectionError, OSError):
            pass
