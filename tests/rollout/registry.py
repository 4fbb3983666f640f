"""A container registry on loopback for the `--pull` tests: Debian's `docker-registry` (the CNCF distribution
registry, `scripts/setup --system`), its storage in a temporary directory, started and stopped by the test.

`registry(tmp, auth=True)` answers every request without credentials with 401 (htpasswd auth, a user nobody logs in
as): the refusing registry. A private dockerd reaches 127.0.0.1 without TLS (Docker treats 127.0.0.0/8 as an
insecure registry by default)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

# htpasswd for user `polar`, bcrypt (the registry accepts only bcrypt); the tests never log in
HTPASSWD = "polar:$2b$05$Kbac.Dk0.4i9a6IOgJsxrOLPSUuCuZ0nuUPqR5fzb8Q.KF2noXuYG\n"
START_WAIT_S = 20.0


def why_not() -> str | None:
    """None when the registry binary is installed, else the reason (for tests.support.need)."""
    return None if shutil.which("docker-registry") else "docker-registry is not installed (apt: docker-registry)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def registry(tmp: Path, auth: bool = False) -> Iterator[str]:
    """A running registry's address (`127.0.0.1:PORT`) for as long as the block runs."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    lines = ["version: 0.1", "log:", "  level: error", "  accesslog:", "    disabled: true", "storage:",
             "  filesystem:", f"    rootdirectory: {tmp / 'storage'}", "http:", f"  addr: 127.0.0.1:{port}"]
    if auth:
        (tmp / "htpasswd").write_text(HTPASSWD)
        lines += ["auth:", "  htpasswd:", "    realm: polar-test", f"    path: {tmp / 'htpasswd'}"]
    (tmp / "config.yml").write_text("\n".join(lines) + "\n")
    log = open(tmp / "registry.log", "wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(tmp / "config.yml")], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait(proc, port, tmp / "registry.log")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited ({proc.returncode}): {log.read_text(errors='replace')[-500:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2)
            return
        except urllib.error.HTTPError:  # 401 from the refusing one: it answers
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"docker-registry did not answer on 127.0.0.1:{port} within {START_WAIT_S:g} s")
