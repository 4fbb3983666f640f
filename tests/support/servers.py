"""Test-server lifecycle shared by the suites: free loopback ports, waiting for a condition, the gateway's readiness
probe, whether a process is still alive, and the start/stop/URLs of a threaded HTTP server on loopback (the scripted
upstreams and the recording relay). Standard library only, so any support module can use it."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02):
    """Call `predicate` until it returns something truthy or `timeout` seconds pass; returns its last value."""
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value or time.time() > deadline:
            return value
        time.sleep(interval)


def probe_ready(port: int) -> dict | None:
    """The addon's readiness answer (`http://polar.gateway/ready` through the proxy on `port`), an error status's
    JSON body included; None while nothing of ours answers (mitmproxy alone, not listening yet, or gone)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{port}"}))
    try:
        with opener.open("http://polar.gateway/ready", timeout=2) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return json.loads(exc.read())
        except ValueError:
            return None
    except Exception:  # noqa: BLE001 — not up yet, or gone
        return None


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def pid_gone(pid: int) -> bool:
    return not pid_alive(pid)


def read_request_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The body of the request `handler` is serving: chunked (trailers skipped) or content-length bytes."""
    if "chunked" in (handler.headers.get("transfer-encoding") or "").lower():
        data = b""
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return data
            data += handler.rfile.read(size)
            handler.rfile.readline()
    n = int(handler.headers.get("content-length") or 0)
    return handler.rfile.read(n) if n else b""


class LoopbackHTTPServer:
    """What a threaded HTTP server on loopback shares: `_serve` starts it in a daemon thread, `_shutdown` stops it
    (a no-op when stopped), `with` runs start()/stop(); `port`, `root_url` and `base_url` (root + /v1) while up.
    A subclass sets `_host`, `_port` (0: any free port) and `_server = None`, and defines start() and stop()."""

    _host: str
    _port: int
    _server: ThreadingHTTPServer | None
    _thread: threading.Thread | None = None

    def _serve(self, server_cls: type[ThreadingHTTPServer], handler: type, name: str) -> None:
        self._server = server_cls((self._host, self._port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self._thread.start()

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def root_url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"
