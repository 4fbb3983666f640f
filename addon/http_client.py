"""The HTTP/1.1 client for the one hot request: the streamed chat call to a plain-http backend.

Everything else the gateway asks the backend (/models, /version, /tokenize) goes through httpx (backend.py). This
client keeps httpx's surface and exception classes so the driver classifies failures the same way either way.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import httpx


class StreamClient:
    """A minimal HTTP/1.1 keep-alive client for the one hot request, the streamed chat call to a plain-http backend.

    Same surface as the httpx.AsyncClient subset the call driver uses (build_request, send(stream=True), and a
    response with status_code, aiter_raw, aread, aclose) and the same httpx exception classes, so failures are
    classified exactly as before. Why: httpx yields one item per HTTP chunk through several async layers, and
    vLLM sends every SSE event as its own chunk; this client yields once per network read. Measured on a 35-chunk
    stream: ~1.2 ms CPU per call with httpx, ~0.12 ms with a raw reader (BENCHMARKS.md). Only `http://` URLs;
    anything else stays on httpx."""

    MAX_IDLE = 512
    MAX_HEAD = 1 << 16

    def __init__(self, base_url: str, headers: dict, connect_timeout: float, write_timeout: float = 60.0):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"StreamClient serves plain http URLs only, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.authority = parts.netloc.rpartition("@")[2]
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.connect_timeout = connect_timeout
        self.write_timeout = write_timeout
        self._idle: list = []

    def build_request(self, method: str, url: str, content: bytes = b"", headers: dict | None = None) -> tuple:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        merged = dict(self.headers)
        for k, v in (headers or {}).items():
            merged[k.lower()] = v
        merged["host"] = self.authority
        merged["content-length"] = str(len(content))
        merged.setdefault("accept", "*/*")
        head = "".join(f"{k}: {v}\r\n" for k, v in merged.items())
        return method, target, f"{method} {target} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + content

    async def _open(self):
        import httpx

        try:
            return await asyncio.wait_for(asyncio.open_connection(self.host, self.port, limit=self.MAX_HEAD),
                                          self.connect_timeout)
        except asyncio.TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connect to {self.authority} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{exc}") from exc

    async def send(self, request: tuple, stream: bool = True, cut: "Cut | None" = None) -> "_StreamResponse":
        """`cut`: the call's handle on the connection (the pool cuts it when the replica is ejected)."""
        import httpx

        _method, _target, data = request
        while self._idle:
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing() or reader._buffer:  # closed or garbage while idle: not reusable
                writer.close()
                continue
            if cut is not None:
                cut.attach(writer)
            try:
                return await self._exchange(reader, writer, data)
            except _Stale:
                writer.close()  # the backend closed the idle connection first: retry once on a new one
                if cut is not None and cut.fired:
                    raise httpx.ReadError("backend connection cut: the replica was ejected") from None
                break
        reader, writer = await self._open()
        if cut is not None:
            cut.attach(writer)
        try:
            return await self._exchange(reader, writer, data)
        except _Stale as exc:
            writer.close()
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.") from exc
        except asyncio.CancelledError:
            writer.close()
            raise

    async def _exchange(self, reader, writer, data: bytes) -> "_StreamResponse":
        import httpx

        try:
            writer.write(data)
            if writer.transport.get_write_buffer_size():
                await asyncio.wait_for(writer.drain(), self.write_timeout)
        except asyncio.TimeoutError as exc:
            writer.close()
            raise httpx.WriteTimeout("backend write timed out") from exc
        except OSError as exc:
            raise _Stale() from exc
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Stale() from exc
            writer.close()
            raise httpx.RemoteProtocolError("Server disconnected while sending the response head.") from exc
        except asyncio.LimitOverrunError as exc:
            writer.close()
            raise httpx.RemoteProtocolError("backend response head is too large") from exc
        except OSError as exc:
            raise _Stale() from exc
        except BaseException:
            writer.close()
            raise
        lines = head[:-4].split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].isdigit():
            writer.close()
            raise httpx.RemoteProtocolError(f"backend sent no HTTP/1.1 status line: {lines[0][:100]!r}")
        length, chunked, close = None, False, status_line[0] == b"HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    writer.close()
                    raise httpx.RemoteProtocolError("backend sent a bad content-length") from None
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"connection":
                close = close or b"close" in value
        return _StreamResponse(self, reader, writer, int(status_line[1]), length, chunked, close)

    def _release(self, reader, writer) -> None:
        if len(self._idle) < self.MAX_IDLE and not writer.is_closing():
            self._idle.append((reader, writer))
        else:
            writer.close()

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()


class Cut:
    """One call's backend connection, cut from outside: the transport aborted, so whatever the call awaits on it (the
    response head, the next chunk) ends in a connection error now rather than at a timeout."""

    __slots__ = ("writer", "fired")

    def __init__(self) -> None:
        self.writer = None
        self.fired = False

    def attach(self, writer) -> None:
        self.writer = writer
        if self.fired:
            writer.transport.abort()

    def __call__(self) -> None:
        self.fired = True
        if self.writer is not None:
            self.writer.transport.abort()


class _Stale(Exception):
    """A connection that ended before any response byte (a reused keep-alive connection the backend had closed)."""


class _StreamResponse:
    def __init__(self, client: StreamClient, reader, writer, status: int, length: int | None, chunked: bool,
                 close: bool):
        self._client, self._reader, self._writer = client, reader, writer
        self.status_code = status
        self._length = length
        self._chunked = chunked
        self._close = close or (length is None and not chunked)  # close-delimited body
        self._complete = False
        self._closed = False

    async def aiter_raw(self):
        """The body as it arrives, chunked framing removed: one item per network read."""
        reader = self._reader
        if self._complete:
            return
        try:
            if not self._chunked:
                left = self._length
                while left is None or left > 0:
                    data = await reader.read(1 << 16 if left is None else min(left, 1 << 16))
                    if not data:
                        if left is None:
                            break
                        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
                    if left is not None:
                        left -= len(data)
                    yield data
                self._complete = True
                return
            buf = b""  # undecoded bytes from the start of a size line or of chunk data
            left = 0  # data bytes left in the current chunk
            skip = 0  # CRLF bytes left after the current chunk's data
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    raise httpx.RemoteProtocolError(
                        "peer closed connection without sending complete message body: incomplete chunked read")
                # Offsets into one buffer per read, no bytearray edits: a read usually holds many small chunks.
                buf = buf + data if buf else data
                out = []
                pos, n = 0, len(buf)
                while pos < n:
                    if left:
                        take = min(left, n - pos)
                        out.append(buf[pos:pos + take])
                        pos += take
                        left -= take
                        continue
                    if skip:
                        take = min(skip, n - pos)
                        pos += take
                        skip -= take
                        continue
                    end = buf.find(b"\r\n", pos)
                    if end < 0:
                        if n - pos > 4096:
                            raise httpx.RemoteProtocolError("bad chunk size line from the backend")
                        break
                    try:
                        size = int(buf[pos:end].split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise httpx.RemoteProtocolError("bad chunk size line from the backend") from None
                    if size == 0:
                        await self._last_chunk(buf[end + 2:])
                        if out:
                            yield b"".join(out)
                        self._complete = True
                        return
                    pos = end + 2
                    if pos + size + 2 <= n:  # the whole chunk is here (the usual case): one step, not three
                        out.append(buf[pos:pos + size])
                        pos += size + 2
                        continue
                    left, skip = size, 2
                buf = buf[pos:]
                if out:
                    yield b"".join(out)
        except OSError as exc:
            raise httpx.ReadError(f"backend connection broke: {exc!r}") from exc

    async def _last_chunk(self, rest: bytes) -> None:
        """After the zero-size chunk's line: read to the blank line that ends the body (after optional trailer
        lines); bytes after the response mean this connection is never reused."""
        reader = self._reader
        while not (rest.startswith(b"\r\n") or b"\r\n\r\n" in rest):
            more = await reader.read(4096)
            if not more:
                raise httpx.RemoteProtocolError("peer closed connection inside the last chunk")
            rest += more
        stop = 2 if rest.startswith(b"\r\n") else rest.index(b"\r\n\r\n") + 4
        if len(rest) > stop:
            self._close = True

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self.aiter_raw()])

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._complete and not self._close:
            self._client._release(self._reader, self._writer)
        else:
            self._writer.close()
