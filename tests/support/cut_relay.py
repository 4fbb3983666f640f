"""A TCP relay on 127.0.0.1 that a test can cut: a replica that fails, in front of a backend that does not.

    relay = CutRelay(("127.0.0.1", 8000))   # relay.base_url → "http://127.0.0.1:<port>/v1"
    relay.cut()       # the listener closes (connections refused) and every live connection is reset
    relay.restore()   # listening again on the same port
    relay.hold()      # the backend's bytes stop at the relay (a call waits for its first byte); relay.withheld counts
    relay.release()   # the chunks held, relay.withheld_posts those answering a POST; release lets them through

Bytes pass through unchanged in both directions, so whatever is behind it (vLLM or a stand-in) is what the gateway sees.
"""

from __future__ import annotations

import socket
import struct
import threading


class CutRelay:
    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.accepted = 0
        self.withheld = 0  # chunks from the backend that waited at a hold
        self.withheld_posts = 0  # of those, chunks answering a POST (a model call, not a probe)
        self._posting: set[socket.socket] = set()  # client sockets that sent a POST
        self._open = threading.Event()
        self._open.set()
        self.restore()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def restore(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for conn in conns:
            _reset(conn)

    close = cut

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    _reset(client)
                    _reset(upstream)
                    continue
                self.accepted += 1
                self._conns.update((client, upstream))
            for a, b, back in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pipe, args=(a, b, back), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_backend: bool = False) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not from_backend and data.startswith(b"POST "):
                    with self._lock:
                        self._posting.add(src)
                if from_backend and not self._open.is_set():
                    with self._lock:
                        self.withheld += 1
                        self.withheld_posts += dst in self._posting
                    self._open.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            with self._lock:
                gone = src in self._conns
                self._conns.discard(src)
            if gone:
                src.close()


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the peer sees a reset, as when a host or process dies. shutdown() first: a close
    alone would neither wake the pipe thread blocked in recv() on it nor release the connection."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
