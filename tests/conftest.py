"""Shared fixtures. Integration fixtures start real processes lazily, once per test session:
`upstream` — the scripted upstream (vLLM's wire format, real tokenizer and template), reset for every test;
`gateway` — the real proxy (mitmdump + our addon, real TLS) in front of it; `.records()` gives this test's records;
`proxy_env` — the gateway with HTTPS_PROXY + SSL_CERT_FILE set (session "test-session"), so the official SDKs
(which use httpx2 and reject an httpx.Client) reach provider hosts through the proxy exactly like an agent does:
`anthropic.Anthropic(api_key="sk-test")`, `openai.OpenAI(api_key="sk-test")`, `genai.Client(api_key="k")`.
Another session: `gateway.apply_env(monkeypatch, "s2")`. Without the environment, tests/support/sdk.py builds the
same clients for one gateway and session; tests/support/records.py and servers.py hold the record helpers and the
server lifecycle (ports, waiting, readiness) the suites share.

The reroute slice: a test marked `reroute` runs twice, `[diverted]` through the session's gateway and `[rerouted]`
through a second one started with `polar_divert=false`, so that the request-hook path (mitmproxy's HTTPFlow, which
the diverted default never takes) meets real mitmdump in every run, CI's included. `gateway.divert` says which it
got. With POLAR_TEST_DIVERT=0 the whole suite is already rerouted and the slice is not doubled.

Skips are counted (issue 42): each test's outcome is kept, and at the end of the session tests/known-skips.txt is
checked against them (tests/support/known_skips.py) — a skip it does not list, a listed skip whose condition does not
hold, a listed test that ran although its condition holds: one line each, and the session fails. Always, not only
under CI=true: the conditions are facts about this machine, so a local run shows a stale entry as CI would; the one
skip the list leaves out, need()'s off CI, is told apart by its mark (tests/support/need.py: not_installed)."""

from __future__ import annotations

import os

import pytest

from tests.support import known_skips
from tests.support.gateway import ROOT, GatewayHandle, start_gateway
from tests.support.need import not_installed

TOKENIZER_DIR = os.path.join(ROOT, ".cache", "models", "tokenizer")
CAPTURES_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "captures"))
WHOLE_SUITE_REROUTED = os.environ.get("POLAR_TEST_DIVERT") == "0"  # tests/support/gateway.py sets it on every start
OUTCOMES: dict[str, tuple[str, str]] = {}  # node id -> (known_skips.SKIPPED | RAN | NOT_INSTALLED, the skip's reason)
SKIP_PROBLEMS: list[str] = []
# polar-rollout --pull's default for every run the suite starts (its own, polar-train's, the TRL integration's): no
# test reaches a registry it did not start; tests/rollout/test_pull.py passes --pull missing against its own.
os.environ["POLAR_ROLLOUT_PULL"] = "never"


def pytest_configure(config):
    config.addinivalue_line("markers", "reroute: also run through a polar_divert=false gateway (the request hook)")


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("reroute") and "gateway" in metafunc.fixturenames \
            and not WHOLE_SUITE_REROUTED:
        metafunc.parametrize("gateway", ["diverted", "rerouted"], indirect=True)


def _reason(report) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        need_skip = call.excinfo is not None and not_installed(call.excinfo.value)
        OUTCOMES[item.nodeid] = (known_skips.NOT_INSTALLED if need_skip else known_skips.SKIPPED, _reason(report))
    elif call.when == "call":
        OUTCOMES.setdefault(item.nodeid, (known_skips.RAN, ""))
    return report


def pytest_collectreport(report):
    if report.skipped:  # a module skipped as a whole
        OUTCOMES[report.nodeid] = (known_skips.SKIPPED, _reason(report))


def pytest_sessionfinish(session):
    try:
        SKIP_PROBLEMS[:] = known_skips.check(known_skips.load(), OUTCOMES)
    except ValueError as e:  # a malformed entry
        SKIP_PROBLEMS[:] = [str(e)]
    if SKIP_PROBLEMS and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if SKIP_PROBLEMS:
        terminalreporter.section("skips against tests/known-skips.txt", red=True)
        for line in SKIP_PROBLEMS:
            terminalreporter.write_line(line, red=True)


@pytest.fixture(scope="session")
def tokenizer_dir() -> str:
    if not os.path.isfile(os.path.join(TOKENIZER_DIR, "tokenizer.json")):
        pytest.fail("offline tokenizer missing: run scripts/setup")
    return TOKENIZER_DIR


@pytest.fixture(scope="session")
def captures_dir() -> str:
    if not os.path.isdir(CAPTURES_DIR):
        pytest.skip("../shared/captures is not present")
    return CAPTURES_DIR


@pytest.fixture(scope="session")
def _upstream_server(tokenizer_dir):
    from tests.support.scripted_upstream import ScriptedUpstream

    with ScriptedUpstream(tokenizer_dir) as server:
        yield server


@pytest.fixture
def upstream(_upstream_server):
    _upstream_server.reset()
    yield _upstream_server
    _upstream_server.reset()


@pytest.fixture(scope="session")
def _gateway_server(_upstream_server, tmp_path_factory) -> GatewayHandle:
    base = tmp_path_factory.mktemp("gateway")
    with start_gateway(_upstream_server.base_url, str(base / "run"), str(base / "flows")) as handle:
        handle.divert = not WHOLE_SUITE_REROUTED
        yield handle


@pytest.fixture(scope="session")
def _rerouted_gateway_server(_upstream_server, tmp_path_factory) -> GatewayHandle:
    """The reroute slice's gateway: the same upstream, every provider call through the request hook."""
    base = tmp_path_factory.mktemp("gateway-rerouted")
    with start_gateway(_upstream_server.base_url, str(base / "run"), str(base / "flows"),
                       sets=["polar_divert=false"]) as handle:
        handle.divert = False
        yield handle


@pytest.fixture
def gateway(request, upstream) -> GatewayHandle:
    """The session's gateway, or for a `reroute` test's `[rerouted]` run the polar_divert=false one."""
    path = getattr(request, "param", "diverted")
    handle = request.getfixturevalue("_rerouted_gateway_server" if path == "rerouted" else "_gateway_server")
    handle.mark()
    return handle


@pytest.fixture
def proxy_env(gateway, monkeypatch) -> GatewayHandle:
    """The gateway, with HTTPS_PROXY (session "test-session") and SSL_CERT_FILE set for SDK clients."""
    gateway.apply_env(monkeypatch)
    return gateway
