"""Contract fixtures: one backend per parameter — the scripted upstream (`integration`) and a real vLLM (`vllm`) —
each started ONCE per test session with a recording relay and its own gateway in front:

    SDK --HTTPS_PROXY--> gateway (mitmdump + addon) --> RecordingRelay --> backend

The relay forwards bytes unchanged and keeps what the backend really sent, so every test compares the record and the
SDK's view against the backend's own bytes, identically for both backends (every contract test runs against both).

The real vLLM is the tiny model started for this suite with `--max-model-len 4096` (`start_vllm`, stopped when the
suite's tests are done; POLAR_TEST_VLLM_CONTRACT_URL reuses a running server). Why not the shared 64k server: the
clamp test must fill the context so that the clamped generation is short, and a 64k prefill takes ~70 s on one CPU
core (4k: well under a second); a random model rarely ends on its own. The scripted upstream gets the same
max_model_len, so every test asks the same of both backends.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx
import pytest

from tests.support.gateway import GatewayHandle, relayed_gateway
from tests.support.recording_relay import Exchange, RecordingRelay

# Context of both contract backends (see the module docstring).
CONTRACT_MAX_MODEL_LEN = 4096
EXTERNAL_URL_ENV = "POLAR_TEST_VLLM_CONTRACT_URL"


@dataclass
class ContractBackend:
    """A backend under contract: its root URL, the relay in front of it, and the gateway in front of the relay."""

    name: str  # "scripted" | "vllm"
    root_url: str
    model: str
    max_model_len: int
    relay: RecordingRelay
    gateway: GatewayHandle

    def _post(self, path: str, body: dict) -> dict:
        # Straight to the backend (not through the relay): the relay log stays the gateway's traffic only.
        r = httpx.post(self.root_url + path, json=body, timeout=120, trust_env=False)
        r.raise_for_status()
        return r.json()

    def tokenize_chat(self, upstream_request: dict) -> list[int]:
        """POST /tokenize with the messages, tools and template kwargs the gateway sent upstream."""
        body = {"model": self.model, "messages": upstream_request["messages"], "add_generation_prompt": True}
        for key in ("tools", "chat_template_kwargs"):
            if upstream_request.get(key):
                body[key] = upstream_request[key]
        return list(self._post("/tokenize", body)["tokens"])

    def count_text(self, text: str) -> int:
        return int(self._post("/tokenize", {"model": self.model, "prompt": text})["count"])

    def mark(self) -> int:
        self.gateway.mark()
        return self.relay.mark()

    def chat_exchange(self, since: int) -> Exchange:
        """The one chat call the gateway made since `since`."""
        chats = self.relay.chats(since)
        assert len(chats) == 1, [c.path for c in chats]
        return chats[0]


def _scripted(tokenizer_dir: str):
    from tests.support.scripted_upstream import ScriptedUpstream

    up = ScriptedUpstream(tokenizer_dir, max_model_len=CONTRACT_MAX_MODEL_LEN)
    up.start()
    return up.root_url, up.model, up.max_model_len, up.stop


def _vllm():
    from tests.support.vllm_server import external_vllm, start_vllm, stop_vllm

    url = os.environ.get(EXTERNAL_URL_ENV)
    # start_vllm skips the test without .venv-vllm or the built model.
    server = external_vllm(url) if url else start_vllm("tiny", max_model_len=CONTRACT_MAX_MODEL_LEN)
    return server.root_url, server.model, server.max_model_len, lambda: stop_vllm(server)


@pytest.fixture(scope="session")
def contract_vllm():
    """(root URL, model, max_model_len) of the suite's real vLLM, started once for every contract test that meets
    it (test_contract's `vllm` backend, test_record_backend's vLLM 0.32), stopped at the session's end."""
    root, model, max_len, stop = _vllm()
    try:
        yield root, model, max_len
    finally:
        stop()


@pytest.fixture(scope="session", params=[pytest.param("scripted", marks=pytest.mark.integration),
                                         pytest.param("vllm", marks=pytest.mark.vllm)])
def contract(request, tokenizer_dir, tmp_path_factory) -> ContractBackend:
    name = request.param
    if name == "scripted":
        root, model, max_len, stop_backend = _scripted(tokenizer_dir)
    else:
        (root, model, max_len), stop_backend = request.getfixturevalue("contract_vllm"), (lambda: None)
    try:
        with relayed_gateway(root, tmp_path_factory.mktemp(f"contract-{name}")) as (relay, gateway):
            yield ContractBackend(name, root, model, max_len, relay, gateway)
    finally:
        stop_backend()


@pytest.fixture
def agent_env(contract: ContractBackend, monkeypatch) -> ContractBackend:
    """The SDKs in this process reach provider hosts through this backend's gateway, like an agent
    (HTTPS_PROXY with session "contract", SSL_CERT_FILE = system CAs + ours)."""
    contract.gateway.apply_env(monkeypatch, "contract")
    for var in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    assert os.environ["HTTPS_PROXY"].startswith("http://contract:")
    return contract
