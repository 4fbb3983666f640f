"""mitmdump -s addon/polar_addon.py — the Polar gateway as a mitmproxy script.

Only mitmproxy and the standard library are imported at module level; the package is imported inside try/except.
If that import fails, a fail-closed addon takes over: it still limits decryption to the provider hosts and answers
every decrypted provider request with the provider's 503, so a provider request never reaches the real host with
the agent's key (docs/field-notes.md, mitmproxy 12: a raising `request` hook lets the flow go on to the real provider).
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


def _load_by_path(name: str):
    # By path, so these stdlib-only modules work even when the `polar` package is not importable.
    spec = importlib.util.spec_from_file_location(f"_polar_{name}", os.path.join(_HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_hosts = _load_by_path("hosts")
_errors = _load_by_path("provider_errors")
_confdir = _load_by_path("confdir")


class FailClosed:
    """Stands in for the gateway when it cannot load: decrypt providers only, answer them with 503, forward nothing."""

    def __init__(self, reason: str):
        self.reason = reason
        self.hosts = _hosts.fail_closed_hosts(())

    def load(self, loader):
        loader.add_option("polar_hosts", Sequence[str], list(_hosts.DEFAULT_HOSTS), "Provider hosts to decrypt.")
        # warning, not error: mitmdump exits on errors logged at startup, and a running fail-closed proxy is what
        # protects agents already pointed at it (e.g. after a script reload with a broken package).
        logging.warning("polar gateway failed to load; failing closed (provider requests get 503): %s", self.reason)

    def configure(self, updated):
        if "polar_hosts" in updated:
            # The defaults plus every entry that parses: a bad entry may widen what gets 503, never narrow it.
            self.hosts = _hosts.fail_closed_hosts(ctx.options.polar_hosts)
        if "connection_strategy" in ctx.options.keys() and ctx.options.connection_strategy != "lazy":
            ctx.options.connection_strategy = "lazy"
        if "confdir" in updated:
            for change in _confdir.secure_confdir(ctx.options.confdir):
                logging.warning("polar: %s (the CA key must stay private)", change)

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        host, port = data.context.server.address or (None, None)
        sni = data.client_hello.sni
        if not (_hosts.is_provider(self.hosts, sni, port) or _hosts.is_provider(self.hosts, host, port)):
            data.ignore_connection = True

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.pretty_host == "polar.gateway" and flow.request.scheme == "http":
            body = {"ready": False, "error": "polar gateway failed to load; failing closed", "reason": self.reason,
                    "fail_closed": True}
            flow.response = http.Response.make(503, json.dumps(body), {"content-type": "application/json"})
            return
        own = flow.client_conn.sockname and flow.request.port == flow.client_conn.sockname[1]  # a base-URL client
        if own or _hosts.is_provider(self.hosts, flow.request.pretty_host, flow.request.port) \
                or flow.request.scheme == "https":
            protocol = _hosts.protocol_for(flow.request.pretty_host, flow.request.path)
            status, content_type, body = _errors.unavailable(protocol, "polar gateway failed to load; see the proxy log")
            flow.response = http.Response.make(status, body, {"content-type": content_type})


try:
    from polar.addon.addons import gateway_addons

    addons = gateway_addons()  # one addon per concern, sharing one Gateway (addon/addons.py lists them)
except Exception:  # noqa: BLE001 — any import failure must fail closed, never open
    addons = [FailClosed(traceback.format_exc(limit=3))]
