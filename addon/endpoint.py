"""The gateway's own HTTP/1.1 endpoint on 127.0.0.1, served on mitmproxy's event loop.

mitmproxy relays provider flows here (`flow.response.stream = True`), so the gateway controls every byte the agent
gets: real incremental streaming, provider-shaped errors for backend trouble before and after headers, and a record
for every call (FIELD-NOTES §2: a plain request rewrite cannot shape a refused connection or a mid-stream loss).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import h11

log = logging.getLogger("polar.endpoint")


class ClientGone(ConnectionError):
    """The peer (mitmproxy, i.e. the agent) closed the connection while we were answering."""


class Responder:
    """Writes one HTTP response: start() headers, send() body pieces, end()."""

    def __init__(self, conn: h11.Connection, writer: asyncio.StreamWriter):
        self._conn = conn
        self._writer = writer
        self.started = False
        self.status: int | None = None
        self.finished = False

    async def _write(self, event) -> None:
        data = self._conn.send(event)
        if data:
            if self._writer.is_closing():
                raise ClientGone("connection closed")
            self._writer.write(data)
            try:
                await self._writer.drain()
            except (ConnectionError, OSError) as exc:
                raise ClientGone(str(exc)) from exc

    async def start(self, status: int, headers: list[tuple[str, str]], length: int | None = None) -> None:
        hdrs = [(k.encode(), v.encode()) for k, v in headers]
        if length is not None:
            hdrs.append((b"content-length", str(length).encode()))
        else:
            hdrs.append((b"transfer-encoding", b"chunked"))
        self.started = True
        self.status = status
        await self._write(h11.Response(status_code=status, headers=hdrs))

    async def send(self, data: bytes) -> None:
        if data:
            await self._write(h11.Data(data=data))

    async def end(self) -> None:
        if not self.finished:
            self.finished = True
            await self._write(h11.EndOfMessage())

    def abort(self) -> None:
        """Close the connection without ending the body: the client sees a cut stream, never a complete answer."""
        self.finished = True
        self._writer.close()

    async def respond(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """A whole response in one write (one segment for mitmproxy to read, one drain)."""
        hdrs = [(k.encode(), v.encode()) for k, v in headers]
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


Handler = Callable[[str, str, list[tuple[bytes, bytes]], bytes, Responder], Awaitable[None]]


class Endpoint:
    def __init__(self, handler: Handler):
        self.handler = handler
        self.server: asyncio.AbstractServer | None = None
        self.port: int | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.server = await asyncio.start_server(self._serve, host, port, limit=1 << 20)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
        try:
            while True:
                request = None
                body = []
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(1 << 16)
                        conn.receive_data(data)
                        if not data and conn.their_state is not h11.DONE:
                            if request is None:
                                return
                        continue
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body.append(bytes(event.data))
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert request is not None
                responder = Responder(conn, writer)
                try:
                    await self.handler(request.method.decode(), request.target.decode(), list(request.headers),
                                       b"".join(body), responder)
                except ClientGone:
                    return
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                if conn.our_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, h11.LocalProtocolError, ConnectionError) as exc:
            log.debug("endpoint connection ended: %s", exc)
        finally:
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass
