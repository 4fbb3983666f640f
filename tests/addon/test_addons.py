"""The gateway as a list of small addons (issue 22): one concern each, only the hooks it needs, one way to build a
PendingCall; an unknown polar_* option and a start-up refusal are one line each.

Scenarios: 1.x the list · 2.x unknown and unparseable `--set` values · 3.x the start-up line.
"""

from __future__ import annotations

import os

import pytest
from mitmproxy import http, options
from mitmproxy.addons import errorcheck, proxyserver
from mitmproxy.test import taddons, tflow

from polar.addon.addons import gateway_addons
from polar.addon.gateway import GatewayAddon
from polar.addon.options import check_sets
from tests.support.addons import PolarGateway

pytestmark = pytest.mark.unit

ADDON = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "addon")

# What each addon hooks into: mitmproxy calls every hook on every addon, so nothing beyond its concern.
HOOKS = {
    "Configuration": {"load", "configure"},
    "ProxyOptions": {"configure"},
    "Loopback": {"load", "configure", "running"},
    "Servers": {"running", "done"},
    "Backends": {"running", "done"},  # running: the pool's health watcher
    "FlowFiles": {"done"},
    "TlsFilter": {"tls_clienthello"},
    "Sessions": {"http_connect", "tls_failed_client", "client_disconnected"},
    "Readiness": {"request"},
    "Refuse": {"http_connect", "request"},
    "Divert": {"next_layer", "client_disconnected"},
    "Hops": {"server_connected", "server_disconnected"},
    "Reroute": {"request", "responseheaders", "response", "error"},
}
ALL_HOOKS = {"load", "configure", "running", "done", "tls_clienthello", "http_connect", "tls_failed_client",
             "client_disconnected", "client_connected", "next_layer", "server_connect", "server_connected",
             "server_disconnected", "request", "requestheaders", "responseheaders", "response", "error",
             "tls_start_client", "tls_established_client", "tcp_start", "tcp_message", "update"}


def test_1_1_each_addon_defines_only_the_hooks_of_its_concern():
    addons = gateway_addons()
    assert [type(a).__name__ for a in addons] == list(HOOKS)
    for addon in addons:
        defined = {name for name in ALL_HOOKS if callable(getattr(addon, name, None))}
        assert defined == HOOKS[type(addon).__name__], type(addon).__name__
    names = [a.name for a in addons]
    assert len(set(names)) == len(names) and all(n.startswith("polar.") for n in names)
    assert len({id(a.gateway) for a in addons}) == 1  # one shared Gateway
    assert all(isinstance(a, GatewayAddon) for a in addons)
    # PolarGateway, the same list behind one object, passes each of those hooks on.
    assert all(callable(getattr(PolarGateway, hook, None)) for hooks in HOOKS.values() for hook in hooks)


def test_1_2_one_function_builds_a_pending_call():
    built = []
    for name in sorted(os.listdir(ADDON)):
        if name.endswith(".py"):
            with open(os.path.join(ADDON, name)) as fh:
                if "PendingCall(" in fh.read().replace("class PendingCall(", ""):
                    built.append(name)
    assert built == ["pending.py"]


def _deferred(*sets: str) -> options.Options:
    opts = options.Options()
    opts.set(*sets, defer=True)  # as mitmdump does before the script registers the options
    return opts


@pytest.mark.parametrize("sets,line", [
    (["polar_exct=true"], "unknown option polar_exct (did you mean polar_exact?)"),
    (["polar_upstrem=http://x/v1"], "unknown option polar_upstrem (did you mean polar_upstream?)"),
    (["polar_exact=yes"], "polar_exact: expected true or false (or the value omitted, meaning true), got 'yes'"),
])
def test_2_1_an_unknown_or_unparseable_set_fails_closed_with_one_line(tmp_path, caplog, sets, line):
    gw = PolarGateway()
    with taddons.context(gw, proxyserver.Proxyserver(), options=_deferred(*sets)) as tctx:
        tctx.configure(gw, polar_flows=str(tmp_path / "flows"))
        gw.endpoint.port = 45678
        assert gw.failure == line
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert errors == [f"polar gateway: {line}; failing closed (provider requests get 503)"]
        flow = tflow.tflow(req=http.Request.make("POST", "https://api.anthropic.com/v1/messages", b"{}"))
        gw.request(flow)
        assert flow.response.status_code == 529 and flow.request.host == "api.anthropic.com"


@pytest.mark.parametrize("sets,line", [
    (["polar_exct=true", "flow_detail=0"], "unknown option polar_exct (did you mean polar_exact?)"),
    (["polar_zzzzzzzz=1"], "unknown option polar_zzzzzzzz (docs/options.md lists the polar options)"),
    (["polar_exact=yes"], "polar_exact: expected true or false (or the value omitted, meaning true), got 'yes'"),
    (["polar_backend=triton"], "polar_backend: expected auto, vllm or sglang, got 'triton'"),
    (["polar_exact", "polar_divert=false", "termlog_verbosity=info"], None),
])
def test_2_2_check_sets_finds_what_the_gateway_would_refuse_without_starting_it(sets, line):
    bad = check_sets(sets)
    assert (str(bad) if bad is not None else None) == line


def test_3_1_at_start_up_under_mitmdump_the_line_says_the_proxy_exits(tmp_path, caplog):
    gw = PolarGateway()
    check = errorcheck.ErrorCheck()
    try:
        with taddons.context(check, gw, options=_deferred("polar_exct=true")) as tctx:
            tctx.configure(gw, polar_flows=str(tmp_path / "flows"))
    finally:
        check.finish()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == ["polar gateway: unknown option polar_exct (did you mean polar_exact?); the proxy exits "
                      "(a bad option at start-up)"]
