"""Start the real gateway (scripts/proxy → mitmdump -s addon/polar_addon.py) for integration tests."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time

import httpx

from polar.addon import record as rec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
        return httpx.Client(proxy=self.proxy_url(session), verify=self.ssl_context(), trust_env=False, **kwargs)

    def sdk_http_client(self, session: str | None = "test-session", **kwargs):
        """For the official SDKs (built on httpx2): a client through the proxy that trusts only our CA."""
        import httpx2

        return httpx2.Client(proxy=self.proxy_url(session), verify=self.ssl_context(), trust_env=False, **kwargs)

    def async_http_client(self, session: str | None = "test-session", **kwargs) -> httpx.AsyncClient:
        return httpx.AsyncClient(proxy=self.proxy_url(session), verify=self.ssl_context(), trust_env=False, **kwargs)

    def all_records(self) -> list[dict]:
        out = []
        for path in rec.expand_inputs([self.flows_dir]) if os.path.isdir(self.flows_dir) else []:
            for _, r in rec.iter_file(path):
                out.append(r)
        out.sort(key=lambda r: (r["t_start"] or 0, r["id"]))
        return out

    def mark(self) -> None:
        """Forget records written so far: records() then returns only newer ones."""
        self._seen = {r["id"] for r in self.all_records()}

    def records(self) -> list[dict]:
        return [r for r in self.all_records() if r["id"] not in self._seen]

    def log_text(self) -> str:
        with open(self.log, "rb") as fh:
            return fh.read().decode("utf-8", "replace")

    def stop(self) -> None:
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "proxy"), "stop", "--run-dir", self.run_dir],
                       check=False, capture_output=True)


def start_gateway(upstream: str, run_dir: str, flows: str, sets: list[str] | None = None,
                  extra_args: list[str] | None = None, env: dict | None = None) -> GatewayHandle:
    os.makedirs(run_dir, exist_ok=True)
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "proxy"), "start", "--upstream", upstream,
           "--flows", flows, "--run-dir", run_dir, "--session", "unused", *(extra_args or [])]
    for item in sets or []:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/proxy start failed ({proc.returncode}):\n{proc.stderr}")
    with open(os.path.join(run_dir, "proxy.json")) as fh:
        return GatewayHandle(json.load(fh), run_dir)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02):
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value or time.time() > deadline:
            return value
        time.sleep(interval)
