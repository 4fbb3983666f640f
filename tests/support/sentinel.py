"""A "real provider" we control: a TLS server on loopback that counts every connection it accepts, and a client
that tunnels one request to it through the proxy the way an agent does (CONNECT, then TLS with the provider's SNI).
polar_hosts names it as `api.anthropic.com:<port>`, so if the proxy ever forwarded a provider flow it would land here."""

from __future__ import annotations

import base64
import socket
import ssl
import threading

import h11

from tests.support.tls import self_signed


class Sentinel:
    """A TLS server playing the real provider: counts every TCP connection it accepts and answers each with `body`.
    Its certificate (`cert`, self-signed for `name`) is its own CA: another name makes it any TLS host of its own."""

    def __init__(self, directory: str, name: str = "api.anthropic.com", body: bytes = b"real-host"):
        self.cert, key = self_signed(directory, name)
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(self.cert, key)
        self.answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            try:
                conn.settimeout(2)
                with self.ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(65536)
                    tls.sendall(self.answer)
            except (OSError, ssl.SSLError):
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def tunnel(proxy_port: int, target_port: int, sni: str, ca_pem: str, method: str = "POST", path: str = "/",
           body: bytes = b"", headers: dict | None = None, host: str | None = None) -> tuple[int, bytes]:
    """CONNECT 127.0.0.1:<target_port> through the proxy, TLS with `sni` trusting only `ca_pem`, one request.
    Returns (status, raw response); raises ssl.SSLError when the certificate is not ours."""
    raw = socket.create_connection(("127.0.0.1", proxy_port), timeout=15)
    auth = base64.b64encode(b"security:x").decode()
    raw.sendall(f"CONNECT 127.0.0.1:{target_port} HTTP/1.1\r\nHost: 127.0.0.1:{target_port}\r\n"
                f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = raw.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    tls = ssl.create_default_context(cafile=ca_pem).wrap_socket(raw, server_hostname=sni)
    conn = h11.Connection(h11.CLIENT)
    try:
        hdrs = [("host", host or sni), ("content-length", str(len(body))), *(headers or {}).items()]
        tls.sendall(conn.send(h11.Request(method=method, target=path, headers=hdrs)) + conn.send(h11.Data(data=body))
                    + conn.send(h11.EndOfMessage()))
        status, out = 0, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(tls.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                out += bytes(event.data)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, out
    finally:
        tls.close()
