"""What the gateway runs beside mitmproxy: the parts that apply their options (`apply`, called by `Configuration`
once every polar_* option parsed) and the addons that start and stop what runs.

- `ControlToken` (a part, no hooks): the control token, read (or created 0600) once per path, and the hold timeout
  (weight publication, docs/architecture.md#the-trainer-side).
- `FlowFiles`: the flow writer, replaced when its directory or limits change.
- `Backends`: the replica pool (`pool.Pool`: one backend client per replica of polar_upstream), replaced when the
  replicas, model, kind, key or connect timeout change; its health watcher runs from `running` (pools of two or more).
- `Servers`: the two loopback servers — the endpoint every call is answered on (ready once it listens) and the
  control server (hold/release) — started side by side in `running`.
"""

from __future__ import annotations

import asyncio
import logging
import os

from mitmproxy import ctx

from polar.records import FlowWriter

from .backend import Backend
from .control import TokenFileError, ensure_token
from .gateway import GatewayAddon
from .http_client import StreamClient
from .options import GatewayOptions
from .pool import Pool

log = logging.getLogger("polar.gateway")


class ControlToken:
    def __init__(self, gateway) -> None:
        self.gateway = gateway

    def apply(self, o: GatewayOptions, old: GatewayOptions | None) -> None:
        """First of the parts: TokenFileError leaves nothing half applied."""
        self._load_token(o)
        self.gateway.control.hold_timeout = o.hold_timeout

    def _load_token(self, o: GatewayOptions) -> None:
        """The default lives in mitmproxy's confdir, made 0700 here when it does not exist yet (mitmproxy would
        create it 0755 later)."""
        g = self.gateway
        if o.control_token is not None:
            path = os.path.abspath(os.path.expanduser(o.control_token))
        else:
            confdir = os.path.expanduser(getattr(ctx.options, "confdir", "~/.mitmproxy"))
            path = os.path.abspath(os.path.join(confdir, "control-token"))
            if not os.path.isdir(confdir):
                try:
                    os.makedirs(confdir, mode=0o700, exist_ok=True)
                except OSError as exc:
                    raise TokenFileError(f"polar_control_token: cannot create {confdir}: {exc}") from None
        if path != g.control_token_path or g.control_server.token is None:
            token = ensure_token(path)
            g.control_server.token = token.encode()
            g.control_token_path = path


class FlowFiles(GatewayAddon):
    def apply(self, o: GatewayOptions, old: GatewayOptions | None) -> None:
        g = self.gateway
        if old is None or g.writer is None or (o.flows, o.rotate_mb, o.min_free_mb) != (
                old.flows, old.rotate_mb, old.min_free_mb):
            writer = FlowWriter(o.flows, o.rotate_mb, o.min_free_mb)  # OSError: the directory cannot be made
            if g.writer is not None:
                g.writer.close()
            g.writer = writer

    def done(self) -> None:
        if self.gateway.writer is not None:
            self.gateway.writer.close()


class Backends(GatewayAddon):
    def apply(self, o: GatewayOptions, old: GatewayOptions | None) -> None:
        g = self.gateway
        if g.pool is None or old is None or (o.replicas, o.upstream_file, o.model, o.backend, o.upstream_api_key,
                                             o.connect_timeout) != (old.replicas, old.upstream_file, old.model,
                                                                    old.backend, old.upstream_api_key,
                                                                    old.connect_timeout):
            self._replace(o)
        elif (o.replica_policy, o.replica_max_inflight) != (old.replica_policy, old.replica_max_inflight):
            g.pool.policy, g.pool.max_inflight = o.replica_policy, o.replica_max_inflight

    def _replace(self, o: GatewayOptions) -> None:
        g = self.gateway
        old = g.pool
        control = g.control

        def make_backend(url: str) -> Backend:
            backend = Backend(url, o.model, o.backend, o.upstream_api_key, o.connect_timeout)
            backend.on_weight_version = control.adopt_backend_version
            # The streamed chat call goes through a lean HTTP/1.1 client on plain-http backends (httpx costs ~10x
            # its CPU per streamed call, BENCHMARKS.md); /models, /version and /tokenize stay on httpx.
            if backend.base_url.startswith("http://"):
                backend.stream_client = StreamClient(backend.base_url, backend.headers, o.connect_timeout)
            return backend

        g.pool = Pool(list(o.replicas), make_backend, policy=o.replica_policy, max_inflight=o.replica_max_inflight,
                      source=o.upstream_file, held=lambda: control.held,
                      released_version=lambda: control.weight_version if control.released_version else None)
        control.pool = g.pool
        if old is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # configured before the event loop runs: nothing was opened yet
            loop.create_task(old.close())
            g.pool.start()

    async def running(self) -> None:
        if self.gateway.pool is not None:
            self.gateway.pool.start()

    async def done(self) -> None:
        if self.gateway.pool is not None:
            await self.gateway.pool.close()


class Servers(GatewayAddon):
    async def running(self) -> None:
        g = self.gateway
        g.started = True
        # The control port is bound before anything yields, so a proxy that answers ready has its control_url; both
        # servers then start side by side (each start yields to the loop once: the not-ready window stays one turn).
        control_port = g.control_server.bind()
        port, _ = await asyncio.gather(g.endpoint.start(), g.control_server.start())
        log.info("polar gateway endpoint on 127.0.0.1:%d, control on 127.0.0.1:%d, upstream %s, flows %s", port,
                 control_port, ctx.options.polar_upstream, os.path.abspath(ctx.options.polar_flows))

    async def done(self) -> None:
        g = self.gateway
        await g.control_server.stop()
        g.control.close()  # held calls go on (and end) rather than wait for a release that cannot come
        await g.endpoint.stop()
