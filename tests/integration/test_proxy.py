"""The proxy as a process: real mitmdump, real TLS. What gets decrypted, fail-closed behaviour, CA files, binding."""

from __future__ import annotations

import os
import socket
import ssl
import stat
import subprocess
import threading

import httpx
import pytest

from tests.support.gateway import ROOT, start_gateway, wait_for
from tests.support.tls import polar_import_blocker, self_signed

pytestmark = pytest.mark.integration


@pytest.fixture
def tls_server(tmp_path):
    """A local HTTPS server with its own certificate, answering every request with 'own-server'."""
    cert, key = self_signed(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    port = sock.getsockname()[1]
    stop = threading.Event()

    def serve():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(65536)
                    tls.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\nconnection: close\r\n\r\nown-server")
            except (OSError, ssl.SSLError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port, cert
    stop.set()
    thread.join(2)
    sock.close()


def test_1_1_non_provider_tls_is_not_decrypted(gateway, tls_server):
    port, cert = tls_server
    # The client trusts ONLY the server's own certificate: this succeeds only if the proxy tunnels raw TCP.
    with httpx.Client(proxy=gateway.proxy_url(), verify=ssl.create_default_context(cafile=cert),
                      trust_env=False) as client:
        resp = client.get(f"https://localhost:{port}/")
    assert resp.text == "own-server"
    # And a client trusting only our CA fails on it: nobody minted a certificate for this host.
    with httpx.Client(proxy=gateway.proxy_url(), verify=gateway.ssl_context(), trust_env=False) as client:
        with pytest.raises(httpx.ConnectError):
            client.get(f"https://localhost:{port}/")
    assert gateway.records() == []


def test_1_2_provider_unknown_path_gets_a_fast_provider_404_and_no_record(gateway):
    with gateway.http_client() as client:
        resp = client.get("https://api.anthropic.com/v1/organizations/settings", headers={"x-api-key": "sk-x"})
    assert resp.status_code == 404 and resp.json()["type"] == "error"
    assert gateway.records() == []


def test_1_3_ca_files_are_private_and_proxy_binds_loopback(gateway):
    certs = os.path.join(ROOT, "certs")
    assert stat.S_IMODE(os.stat(certs).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(certs, "mitmproxy-ca.pem")).st_mode) == 0o600
    tracked = subprocess.run(["git", "ls-files", "certs"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert sorted(tracked) == ["certs/.gitignore", "certs/README.md"]
    assert gateway.state["listen_host"] == "127.0.0.1"
    assert listening_addresses(gateway.port) == ["127.0.0.1"]


def listening_addresses(port: int) -> list[str]:
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
    return sorted({line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()})


def test_1_4_without_listen_host_the_addon_binds_loopback(tmp_path, upstream):
    port = free_port()
    proc = subprocess.Popen([os.path.join(ROOT, ".venv", "bin", "mitmdump"), "-q", "-s",
                             os.path.join(ROOT, "addon", "polar_addon.py"), "--listen-port", str(port),
                             "--set", f"confdir={ROOT}/certs", "--set", f"polar_upstream={upstream.base_url}",
                             "--set", f"polar_flows={tmp_path}/flows"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # mitmdump may bind its default for a moment before the script has loaded (README: pass --listen-host to
        # avoid even that); once the addon runs, only loopback is left.
        wait_for(lambda: listening_addresses(port) == ["127.0.0.1"], timeout=30)
        assert listening_addresses(port) == ["127.0.0.1"]
    finally:
        proc.terminate()
        proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_2_1_package_import_failure_fails_closed(tmp_path, upstream):
    """With the polar package unimportable, provider requests get 503 locally and never reach the real host."""
    env = polar_import_blocker(tmp_path)
    gw = start_gateway(upstream.base_url, str(tmp_path / "run"), str(tmp_path / "flows"),
                       extra_args=["--allow-fail-closed"], env=env)
    try:
        with gw.http_client() as client:
            resp = client.post("https://api.anthropic.com/v1/messages", json={"model": "m"},
                               headers={"x-api-key": "sk-secret"})
        assert resp.status_code == 503
        assert "failed to load" in resp.text
        assert "failing closed" in gw.log_text()
        assert upstream.requests == []
    finally:
        gw.stop()
