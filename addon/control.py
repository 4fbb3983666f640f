"""The gateway's control endpoints (weight publication, docs/architecture.md#the-trainer-side): hold generation while
the backend reloads its weights, release it with the new policy version, and say where things stand.

  POST /admin/hold                               held until released, or until `polar_hold_timeout` expires
  POST /admin/release {"weight_version": V}      V (a string) becomes the version stamped on records; absent: kept
  GET  /admin/state                              {"held", "weight_version", "in_flight", "waiting", "served", ...}

They listen on their own port on 127.0.0.1 (never the agent-facing one), and every request needs the header
`x-polar-control-token` equal to the token file's content (`polar_control_token`, default
`<confdir>/control-token`, created 0600 at start): 401 without the header, 403 with a wrong one. The comparison is
constant-time. The server runs on mitmproxy's event loop, so the state below needs no lock.

Held generation requests wait just before they are sent to the backend (agents see latency, not errors); streams
already sent finish. `in_flight` counts requests past the gate and not yet finished, so a reloader can wait for them
to drain before it pauses the backend: a request sent after the pause would be generated with the new weights but
stamped with the old version.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import socket
import stat
import time
from collections.abc import AsyncIterator

import h11
import orjson

from polar.records.schema import MAX_VERSION_CHARS

log = logging.getLogger("polar.control")

TOKEN_HEADER = b"x-polar-control-token"
MAX_BODY_BYTES = 64 * 1024


class TokenFileError(OSError):
    """The token file cannot be created or read, or is empty."""


def ensure_token(path: str) -> str:
    """The control token in `path`, created (0600, 32 random bytes in hex) when the file is absent. A file readable
    by others is tightened to 0600 (logged): whoever can read it can hold every generation. TokenFileError's message
    is the one line the gateway logs."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            os.chmod(path, 0o600)
            log.warning("polar control: %s was %04o, made it 0600 (the control token must stay private)", path, mode)
        with open(path) as fh:
            token = fh.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"polar_control_token: cannot create or read the token file {path}: {exc}") from None
    if not token:
        raise TokenFileError(f"polar_control_token: the token file {path} is empty")
    return token


class Control:
    """Hold / release / version state, shared by the control server and every call (one per gateway)."""

    def __init__(self, hold_timeout: float = 120.0):
        self.hold_timeout = hold_timeout
        self.weight_version: str | None = None
        self.released_version = False  # a release named a version: the backend's probe no longer overrides it
        self.in_flight = 0
        self.waiting = 0
        self.holds = 0  # holds ever taken, and how many of them expired (the state answer shows both)
        self.expired = 0
        self._open = asyncio.Event()
        self._open.set()
        self._expiry: asyncio.TimerHandle | None = None
        self._held_since: float | None = None
        # calls served per path (the gateway counts them; the state answer and the readiness probe show them)
        self.served = {"diverted": 0, "rerouted": 0, "base_url": 0, "base_url_refused": 0}
        # how each call's prompt ids were read from the backend: kept as its ASCII digits ("fast") or parsed whole
        # ("parsed", the fallback: a backend that spaces its arrays, a torn chunk)
        self.prompt_ids = {"fast": 0, "parsed": 0}
        self.pool = None  # pool.Pool (Backends): its state is shown, and a release has it check every replica again

    @property
    def held(self) -> bool:
        return not self._open.is_set()

    def hold(self) -> None:
        """Hold new generations; a second hold while held restarts the timeout."""
        if self._expiry is not None:
            self._expiry.cancel()
        if not self.held:
            self._held_since = time.monotonic()
            self.holds += 1
        self._open.clear()
        self._expiry = asyncio.get_running_loop().call_later(self.hold_timeout, self._expire)
        log.info("polar control: generation held (expires in %g s unless released)", self.hold_timeout)

    def release(self, version: str | None = None) -> None:
        if version is not None:
            self.weight_version = version
            self.released_version = True
        was_held = self.held
        self._reopen()
        if self.pool is not None and len(self.pool.replicas) > 1:
            asyncio.get_running_loop().create_task(self.pool.after_release())
        if was_held or version is not None:
            log.info("polar control: released, weight_version %s, %d waiting go on", self.weight_version, self.waiting)

    def adopt_backend_version(self, version: str | None) -> None:
        """The backend's own `/weight_info` answer (read when the backend is probed): the version unless a release
        has named one since (the reloader sets both to the same value; a release is the later word)."""
        if version is not None and not self.released_version:
            self.weight_version = version

    def _expire(self) -> None:
        self._expiry = None
        if self.held:
            self.expired += 1
            log.warning("polar control: hold expired after %g s without a release (polar_hold_timeout); serving "
                        "resumes with weight_version %s", self.hold_timeout, self.weight_version)
            self._reopen()

    def _reopen(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._held_since = None
        self._open.set()

    @contextlib.asynccontextmanager
    async def generation(self) -> AsyncIterator[str | None]:
        """Around one backend generation request: waits while held, then counts it in flight; yields the version
        current when it is sent."""
        while self.held:
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
        self.in_flight += 1
        try:
            yield self.weight_version
        finally:
            self.in_flight -= 1

    def state(self) -> dict:
        held_for = time.monotonic() - self._held_since if self._held_since is not None else None
        return {"held": self.held, "weight_version": self.weight_version, "in_flight": self.in_flight,
                "waiting": self.waiting, "held_for_s": held_for, "hold_timeout_s": self.hold_timeout,
                "holds": self.holds, "expired": self.expired, "served": dict(self.served),
                "prompt_ids": dict(self.prompt_ids),
                "pool": self.pool.state() if self.pool is not None else None}

    def close(self) -> None:
        self._reopen()


class ControlServer:
    """HTTP/1.1 on 127.0.0.1 (one request per connection) in front of a `Control`."""

    def __init__(self, control: Control, token: str | None):
        self.control = control
        self.token = token.encode() if token is not None else None  # None: no token file yet (options bad)
        self._server: asyncio.AbstractServer | None = None
        self._sock: socket.socket | None = None
        self.port: int | None = None

    @property
    def url(self) -> str | None:
        return f"http://127.0.0.1:{self.port}" if self.port is not None else None

    def bind(self) -> int:
        """Bind and listen now, without yielding to the event loop: the URL is known before anything awaits (a
        connection made before `start` waits in the backlog)."""
        if self._sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            sock.setblocking(False)
            self._sock = sock
            self.port = sock.getsockname()[1]
        return self.port

    async def start(self) -> int:
        self.bind()
        self._server = await asyncio.start_server(self._serve, sock=self._sock)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
        self.port = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
        try:
            request, body = await asyncio.wait_for(self._read(conn, reader), 10.0)
            status, doc = self.answer(request, body)
        except (h11.RemoteProtocolError, ValueError, asyncio.TimeoutError):
            status, doc = 400, {"error": "bad request"}
        except ConnectionError:
            writer.close()
            return
        data = orjson.dumps(doc)
        with contextlib.suppress(h11.LocalProtocolError, ConnectionError):
            out = conn.send(h11.Response(status_code=status, headers=[
                (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                (b"connection", b"close")]))
            writer.write(out + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
            await writer.drain()
        writer.close()

    @staticmethod
    async def _read(conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[h11.Request, bytes]:
        request, body = None, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("control client went away")
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY_BYTES:
                    raise ValueError("body too large")
            elif isinstance(event, h11.EndOfMessage):
                return request, body
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("control client went away")

    def answer(self, request: h11.Request, body: bytes) -> tuple[int, dict]:
        """(status, JSON answer) for one request; the token is checked before anything else is looked at."""
        given = [v for k, v in request.headers if k == TOKEN_HEADER]
        if self.token is None:
            return 503, {"error": "no control token (polar_control_token failed; see the proxy log)"}
        if not given:
            return 401, {"error": "x-polar-control-token required"}
        if len(given) != 1 or not hmac.compare_digest(given[0], self.token):
            return 403, {"error": "wrong x-polar-control-token"}
        route = (request.method, request.target.split(b"?", 1)[0])
        c = self.control
        if route == (b"GET", b"/admin/state"):
            return 200, c.state()
        if route == (b"POST", b"/admin/hold"):
            c.hold()
            return 200, c.state()
        if route == (b"POST", b"/admin/release"):
            try:
                version = _release_version(body)
            except ValueError as exc:
                return 400, {"error": str(exc)}
            c.release(version)
            return 200, c.state()
        if route[1] in (b"/admin/state", b"/admin/hold", b"/admin/release"):
            return 405, {"error": "method not allowed"}
        return 404, {"error": "not found"}


def _release_version(body: bytes) -> str | None:
    """The release body's `weight_version`: a non-empty string; absent or null keeps the current one."""
    if not body.strip():
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ValueError("release body must be a JSON object") from None
    if not isinstance(doc, dict):
        raise ValueError("release body must be a JSON object")
    version = doc.get("weight_version")
    if version is None:
        return None
    if not isinstance(version, str) or not version or len(version) > MAX_VERSION_CHARS or not version.isprintable():
        raise ValueError(f"weight_version must be a printable string of 1-{MAX_VERSION_CHARS} characters")
    return version
