"""mitmproxy's own options as the gateway needs them, set whatever the command line said.

- `ProxyOptions`: lazy connections (eager ones would dial the real provider on every CONNECT), HTTP/2 off (h2 costs
  ~2.3x CPU: docs/field-notes.md, mitmproxy 12), the CA directory private (0700, its keys 0600).
- `Loopback`: listen on 127.0.0.1 unless the user chose an address, including the servers mitmdump started before
  the script loaded.
"""

from __future__ import annotations

import logging

from mitmproxy import ctx

from .confdir import secure_confdir
from .gateway import GatewayAddon

log = logging.getLogger("polar.gateway")


class ProxyOptions(GatewayAddon):
    def __init__(self, gateway) -> None:
        super().__init__(gateway)
        self._confdir_checked = False

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if "connection_strategy" in opts and opts.connection_strategy != "lazy":
            opts.connection_strategy = "lazy"
        if "http2" in opts and opts.http2:
            opts.http2 = False
        if "confdir" in opts and ("confdir" in updated or not self._confdir_checked):
            self._confdir_checked = True
            for change in secure_confdir(opts.confdir):
                log.warning("polar gateway: %s (the CA key must stay private)", change)


class Loopback(GatewayAddon):
    def __init__(self, gateway) -> None:
        super().__init__(gateway)
        self._forced = False

    def load(self, loader) -> None:
        self._bind()

    def configure(self, updated: set[str]) -> None:
        if "listen_host" in updated:
            self._bind()

    def running(self) -> None:
        if self._forced:
            self._rebind()

    def _bind(self) -> None:
        opts = ctx.options
        if "listen_host" in opts and opts.listen_host == "":
            opts.listen_host = "127.0.0.1"
            self._forced = True

    def _rebind(self) -> None:
        # mitmdump loads -s scripts concurrently with starting its servers, and a listen_host change alone does not
        # restart them: pin each mode without its own address to 127.0.0.1, which restarts it there.
        from mitmproxy.proxy import mode_specs

        modes, changed = [], False
        for text in ctx.options.mode:
            spec = mode_specs.ProxyMode.parse(text)
            port = spec.listen_port(ctx.options.listen_port)
            if spec.custom_listen_host is None and port is not None:
                text = f"{spec.type_name}{':' + spec.data if spec.data else ''}@127.0.0.1:{port}"
                changed = True
            modes.append(text)
        if changed:
            ctx.options.mode = modes
