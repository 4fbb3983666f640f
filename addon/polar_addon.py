"""mitmdump -s addon/polar_addon.py — the Polar gateway as a mitmproxy script.

Only mitmproxy and the standard library are imported at module level; the package is imported inside try/except.
If that import fails, a fail-closed addon takes over: it still limits decryption to the provider hosts and answers
every decrypted provider request with the provider's 503, so a provider request never reaches the real host with
the agent's key (FIELD-NOTES §2: a raising `request` hook lets the flow go on to the real provider).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import traceback
from collections.abc import Sequence

from mitmproxy import ctx, http, tls

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_hosts_module():
    # By path, so the host list is available even when the `polar` package is not importable.
    spec = importlib.util.spec_from_file_location("_polar_hosts", os.path.join(_HERE, "hosts.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_hosts = _load_hosts_module()


class FailClosed:
    """Stands in for the gateway when it cannot load: decrypt providers only, answer them with 503, forward nothing."""

    def __init__(self, reason: str):
        self.reason = reason
        self.hosts = _hosts.parse_hosts(_hosts.DEFAULT_HOSTS)

    def load(self, loader):
        loader.add_option("polar_hosts", Sequence[str], list(_hosts.DEFAULT_HOSTS), "Provider hosts to decrypt.")
        # warning, not error: mitmdump exits on errors logged at startup, and a running fail-closed proxy is what
        # protects agents already pointed at it (e.g. after a script reload with a broken package).
        logging.warning("polar gateway failed to load; failing closed (provider requests get 503): %s", self.reason)

    def configure(self, updated):
        if "polar_hosts" in updated:
            self.hosts = _hosts.parse_hosts(ctx.options.polar_hosts)
        if "connection_strategy" in ctx.options.keys() and ctx.options.connection_strategy != "lazy":
            ctx.options.connection_strategy = "lazy"

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        host, port = data.context.server.address or (None, None)
        sni = data.client_hello.sni
        if not (_hosts.is_provider(self.hosts, sni, port) or _hosts.is_provider(self.hosts, host, port)):
            data.ignore_connection = True

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.pretty_host == "polar.gateway" and flow.request.scheme == "http":
            body = {"ready": False, "error": "polar gateway failed to load; failing closed", "reason": self.reason}
            flow.response = http.Response.make(503, json.dumps(body), {"content-type": "application/json"})
            return
        if _hosts.is_provider(self.hosts, flow.request.pretty_host, flow.request.port) or flow.request.scheme == "https":
            body = {"error": {"type": "overloaded_error" if "anthropic" in flow.request.pretty_host else "unavailable",
                              "message": "polar gateway failed to load; see the proxy log", "code": 503}}
            flow.response = http.Response.make(503, json.dumps(body), {"content-type": "application/json"})


try:
    from polar.addon.gateway import PolarGateway

    addons = [PolarGateway()]
except Exception:  # noqa: BLE001 — any import failure must fail closed, never open
    addons = [FailClosed(traceback.format_exc(limit=3))]
