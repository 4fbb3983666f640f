"""The gateway's addon list: `gateway_addons()` is what `addon/polar_addon.py` hands mitmdump (as
`mitmproxy.addons.default_addons()` is mitmproxy's). It stands above the addons it lists, which import
`addon/gateway.py` for the state they share and never this module (the order and each addon's concern: gateway.py's
docstring)."""

from __future__ import annotations

from .configuration import Configuration
from .connections import Refuse, Sessions, TlsFilter
from .divert import Divert, Hops
from .gateway import Gateway
from .proxy_options import Loopback, ProxyOptions
from .readiness import Readiness
from .reroute import Reroute
from .services import Backends, ControlToken, FlowFiles, Servers


def gateway_addons(gateway: Gateway | None = None) -> list:
    """The gateway's addons, in the order mitmproxy must call them (see gateway.py's docstring)."""
    g = gateway if gateway is not None else Gateway()
    flows, backends = FlowFiles(g), Backends(g)
    return [Configuration(g, ControlToken(g), flows, backends), ProxyOptions(g), Loopback(g), Servers(g), backends,
            flows, TlsFilter(g), Sessions(g), Readiness(g), Refuse(g), Divert(g), Hops(g), Reroute(g)]
