"""Issue item 6 end to end: a record carries `backend` {kind, version, system_fingerprint}, `sampling.logprobs_mode`
(what the gateway was told the backend runs with) and `weight_versions` when the backend gives them (vLLM ≥ 0.33,
asked with `return_weight_versions`), through the real proxy for each protocol, JSON and streaming.
"""

from __future__ import annotations

import pytest

from tests.contract.test_contract import AGENTS, PROTOCOLS
from tests.support.gateway import relayed_gateway
from tests.support.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def new_vllm(tokenizer_dir, tmp_path_factory):
    with ScriptedUpstream(tokenizer_dir, version="0.33.1") as up, \
            relayed_gateway(up.root_url, tmp_path_factory.mktemp("vllm-033"),
                            sets=["polar_logprobs_mode=processed_logprobs"]) as (relay, gateway):
        yield up, relay, gateway


@pytest.mark.parametrize("mode", ["json", "stream"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_1_record_carries_backend_logprobs_mode_and_weight_versions(new_vllm, monkeypatch, protocol, mode):
    up, relay, gateway = new_vllm
    gateway.mark()
    gateway.apply_env(monkeypatch, "wv-session")
    since = relay.mark()
    AGENTS[protocol]("Say hi.", 8, mode == "stream", False)
    (ex,) = relay.chats(since)
    assert ex.json()["return_weight_versions"] is True
    truth = ex.truth()
    assert truth.weight_versions == ["0"]
    (r,) = gateway.records()
    assert r["error"] is None
    assert r["backend"] == {"kind": "vllm", "version": "0.33.1", "system_fingerprint": truth.system_fingerprint}
    assert r["backend"]["system_fingerprint"] == up.system_fingerprint
    assert r["sampling"]["logprobs_mode"] == "processed_logprobs"
    assert r["weight_versions"] == ["0"]
