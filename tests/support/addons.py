"""The gateway's addon list behind one object, for the unit tests: `PolarGateway` passes each hook to every addon of
`gateway_addons()` that defines it, in list order — what mitmproxy does with the list (product code registers the
list itself, addon/polar_addon.py)."""

from __future__ import annotations

import inspect

from polar.addon import pending as pending_calls
from polar.addon.addons import gateway_addons
from polar.addon.call import PendingCall
from polar.addon.endpoint import Request
from polar.addon.gateway import Gateway


class PolarGateway(Gateway):
    """The gateway's addons behind one object (tests, embedding): its state, and each hook passed to every addon of
    `gateway_addons` that defines it, in order — what mitmproxy does with the list. Register this or the list,
    never both. The addons are also attributes by their class name in lower case (`gw.reroute`)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts = gateway_addons(self)
        for part in self.parts:
            setattr(self, type(part).__name__.lower(), part)

    def _each(self, name: str):
        return [getattr(part, name) for part in self.parts if hasattr(part, name)]

    def _pending_from(self, request: Request) -> PendingCall:
        return pending_calls.from_request(request)


def _sync_hook(name: str):
    def hook(self, *args) -> None:
        for func in self._each(name):
            func(*args)

    hook.__name__ = name
    return hook


def _async_hook(name: str):
    async def hook(self, *args) -> None:
        for func in self._each(name):
            result = func(*args)
            if inspect.isawaitable(result):
                await result

    hook.__name__ = name
    return hook


for _name in ("load", "configure", "tls_clienthello", "http_connect", "tls_failed_client", "client_disconnected",
              "next_layer", "server_connected", "server_disconnected", "request", "responseheaders", "response",
              "error"):
    setattr(PolarGateway, _name, _sync_hook(_name))
for _name in ("running", "done"):
    setattr(PolarGateway, _name, _async_hook(_name))
