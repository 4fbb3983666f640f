"""Start the real gateway (scripts/proxy → mitmdump -s polar/addon/polar_addon.py) for integration tests.

`start_gateway(...)` returns a GatewayHandle, which stops the proxy on `stop()` or at the end of a `with` block;
`relayed_gateway(...)` puts a recording relay between a backend and a new gateway. `proxy_client` /
`proxy_sdk_client` are the httpx / httpx2 clients an agent would use to reach provider hosts through a proxy."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
from typing import Iterator

import httpx

from polar.launch import paths
from polar.launch.runfiles import ProxyRunFile
from tests.support.records import flow_records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROXY = [sys.executable, os.path.join(ROOT, "scripts", "proxy")]  # scripts/proxy as a command


def proxy_client(proxy: str, ca_pem: str, **kwargs) -> httpx.Client:
    """An httpx client that reaches provider hosts through `proxy` (a URL), trusting only `ca_pem`."""
    return httpx.Client(proxy=proxy, verify=ssl.create_default_context(cafile=ca_pem), trust_env=False, **kwargs)


def proxy_sdk_client(proxy: str, ca_pem: str, **kwargs):
    """The same for the official SDKs (built on httpx2, and the Anthropic SDK rejects httpx clients)."""
    import httpx2

    return httpx2.Client(proxy=proxy, verify=ssl.create_default_context(cafile=ca_pem), trust_env=False, **kwargs)


class GatewayHandle:
    def __init__(self, state: dict, run_dir: str):
        self.state = state
        self.run_dir = run_dir
        self.port: int = state["port"]
        self.ca_pem: str = state["ca_pem"]
        self.ca_bundle: str = state["ca_bundle"]
        self.flows_dir: str = state["flows"]
        self.log: str = state["log"]
        self._seen: set[str] = set()

    def proxy_url(self, session: str | None = "test-session") -> str:
        if session is None:
            return f"http://127.0.0.1:{self.port}"
        return f"http://{session}:x@127.0.0.1:{self.port}"

    def env(self, session: str | None = "test-session") -> dict[str, str]:
        """What an agent gets: HTTPS_PROXY with the session as user name, a system-plus-ours CA bundle."""
        proxy = self.proxy_url(session)
        return {"HTTPS_PROXY": proxy, "https_proxy": proxy, "SSL_CERT_FILE": self.ca_bundle,
                "REQUESTS_CA_BUNDLE": self.ca_bundle, "NODE_EXTRA_CA_CERTS": self.ca_pem,
                "CODEX_CA_CERTIFICATE": self.ca_pem}

    def apply_env(self, monkeypatch, session: str | None = "test-session") -> None:
        """Point SDKs in this process at the proxy the way an agent is (HTTPS_PROXY + SSL_CERT_FILE)."""
        for var in ("NO_PROXY", "no_proxy", "SSL_CERT_DIR", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(var, raising=False)
        for key, value in self.env(session).items():
            monkeypatch.setenv(key, value)

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_pem)

    def http_client(self, session: str | None = "test-session", **kwargs) -> httpx.Client:
        """An httpx client that reaches provider hosts through the proxy, trusting only our CA."""
        return proxy_client(self.proxy_url(session), self.ca_pem, **kwargs)

    def sdk_http_client(self, session: str | None = "test-session", **kwargs):
        """For the official SDKs (built on httpx2): a client through the proxy that trusts only our CA."""
        return proxy_sdk_client(self.proxy_url(session), self.ca_pem, **kwargs)

    def async_http_client(self, session: str | None = "test-session", **kwargs) -> httpx.AsyncClient:
        return httpx.AsyncClient(proxy=self.proxy_url(session), verify=self.ssl_context(), trust_env=False, **kwargs)

    def all_records(self) -> list[dict]:
        return flow_records(self.flows_dir)

    def mark(self) -> None:
        """Forget records written so far: records() then returns only newer ones."""
        self._seen = {r["id"] for r in self.all_records()}

    def records(self) -> list[dict]:
        return [r for r in self.all_records() if r["id"] not in self._seen]

    def admin_state(self) -> dict:
        """GET /admin/state with the control token (the gateway's counters: served, prompt_ids, ...)."""
        with open(self.state["control_token"]) as fh:
            token = fh.read().strip()
        with httpx.Client(trust_env=False, timeout=10) as client:
            return client.get(self.state["control_url"] + "/admin/state",
                              headers={"x-polar-control-token": token}).json()

    def log_text(self) -> str:
        with open(self.log, "rb") as fh:
            return fh.read().decode("utf-8", "replace")

    def stop(self) -> None:
        subprocess.run([*PROXY, "stop", "--run-dir", self.run_dir], check=False, capture_output=True)

    def __enter__(self) -> "GatewayHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_gateway(upstream: str, run_dir: str, flows: str, sets: list[str] | None = None,
                  extra_args: list[str] | None = None, env: dict | None = None) -> GatewayHandle:
    os.makedirs(run_dir, exist_ok=True)
    cmd = [*PROXY, "start", "--upstream", upstream, "--flows", flows, "--run-dir", run_dir, "--session", "unused",
           *(extra_args or [])]
    if os.environ.get("POLAR_TEST_DIVERT") == "0":  # the whole suite on the request-hook path (polar_divert=false)
        sets = [*(sets or []), "polar_divert=false"]
    for item in sets or []:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/proxy start failed ({proc.returncode}):\n{proc.stderr}")
    return GatewayHandle(ProxyRunFile.read(paths.proxy_run_file(run_dir)).to_dict(), run_dir)


@contextlib.contextmanager
def relayed_gateway(backend: str, base, sets: list[str] | None = None) -> Iterator[tuple]:
    """backend ← RecordingRelay ← a new gateway (run dir and flows under `base`): yields (relay, gateway), stops
    both on exit. `backend` is the backend's root or /v1 URL."""
    from tests.support.recording_relay import RecordingRelay

    with RecordingRelay(backend) as relay, \
            start_gateway(relay.base_url, os.path.join(base, "run"), os.path.join(base, "flows"), sets=sets) as gw:
        yield relay, gw
