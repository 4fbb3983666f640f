"""Shared fixtures. Integration fixtures start real processes lazily, once per test session:
`upstream` — the scripted upstream (vLLM's wire format, real tokenizer and template), reset for every test;
`gateway` — the real proxy (mitmdump + our addon, real TLS) in front of it; `.records()` gives this test's records;
`proxy_env` — the gateway with HTTPS_PROXY + SSL_CERT_FILE set (session "test-session"), so the official SDKs
(which use httpx2 and reject an httpx.Client) reach provider hosts through the proxy exactly like an agent does:
`anthropic.Anthropic(api_key="sk-test")`, `openai.OpenAI(api_key="sk-test")`, `genai.Client(api_key="k")`.
Another session: `gateway.apply_env(monkeypatch, "s2")`. Without the environment, tests/support/sdk.py builds the
same clients for one gateway and session; tests/support/records.py and servers.py hold the record helpers and the
server lifecycle (ports, waiting, readiness) the suites share."""

from __future__ import annotations

import os

import pytest

from tests.support.gateway import ROOT, GatewayHandle, start_gateway

TOKENIZER_DIR = os.path.join(ROOT, ".cache", "models", "tokenizer")
CAPTURES_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "captures"))


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
        yield handle


@pytest.fixture
def gateway(_gateway_server, upstream) -> GatewayHandle:
    _gateway_server.mark()
    return _gateway_server


@pytest.fixture
def proxy_env(gateway, monkeypatch) -> GatewayHandle:
    """The gateway, with HTTPS_PROXY (session "test-session") and SSL_CERT_FILE set for SDK clients."""
    gateway.apply_env(monkeypatch)
    return gateway
