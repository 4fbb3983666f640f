"""Issue item 6 end to end: a record carries `backend` {kind, version, system_fingerprint}, `sampling.logprobs_mode`
(what the gateway was told the backend runs with) and `weight_versions` when the backend gives them (vLLM ≥ 0.33,
asked with `return_weight_versions`), through the real proxy for each protocol, JSON and streaming.

The same assertions meet two backends, each judged by what it answers itself (its /version, the relay's bytes):
- `vllm-0.32`: the REAL vLLM installed here (the contract suite's server, tests/contract/conftest.py): no
  `return_weight_versions` asked, none given, the record's `weight_versions` null.
- `stand-in-0.33.1`: no vLLM ≥ 0.33 runs here, so the scripted upstream plays one. Its weight versions have the wire
  shape vLLM's own test of weight-version delivery expects (per choice, spans `{"version", "start", "end"}` of the
  sampled ids, on the full choice or the terminal chunk's; tests/support/scripted_upstream.py), not a recording.
"""

from __future__ import annotations

import contextlib

import httpx
import pytest

from tests.contract.test_contract import AGENTS, PROTOCOLS
from tests.support.gateway import relayed_gateway
from tests.support.scripted_upstream import ScriptedUpstream


@pytest.fixture(scope="module", params=[pytest.param("vllm-0.32", marks=pytest.mark.vllm),
                                        pytest.param("stand-in-0.33.1", marks=pytest.mark.integration)])
def backend(request, tokenizer_dir, tmp_path_factory):
    with contextlib.ExitStack() as stack:
        if request.param == "vllm-0.32":
            root = request.getfixturevalue("contract_vllm")[0]
        else:
            root = stack.enter_context(ScriptedUpstream(tokenizer_dir, version="0.33.1")).root_url
        relay, gateway = stack.enter_context(relayed_gateway(root, tmp_path_factory.mktemp(request.param),
                                                             sets=["polar_logprobs_mode=processed_logprobs"]))
        version = httpx.get(root + "/version", timeout=10, trust_env=False).json()["version"]
        yield root, version, relay, gateway


def _at_least_033(version: str) -> bool:
    return tuple(int(x) for x in version.split(".")[:2]) >= (0, 33)


@pytest.mark.parametrize("mode", ["json", "stream"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_1_record_carries_backend_logprobs_mode_and_weight_versions(backend, monkeypatch, protocol, mode):
    root, version, relay, gateway = backend
    gateway.mark()
    gateway.apply_env(monkeypatch, "wv-session")
    since = relay.mark()
    AGENTS[protocol]("Say hi.", 8, mode == "stream", False)
    (ex,) = relay.chats(since)
    truth = ex.truth()
    new = _at_least_033(version)
    assert ex.json().get("return_weight_versions") is (True if new else None)
    if new:  # per choice: spans of the sampled ids, each with the version that sampled them
        spans = truth.weight_versions
        assert spans and all(set(s) == {"version", "start", "end"} and isinstance(s["version"], str) for s in spans)
        assert (spans[0]["start"], spans[-1]["end"]) == (0, len(truth.completion_ids)), spans
    else:
        assert truth.weight_versions is None
    (r,) = gateway.records()
    assert r["error"] is None
    assert r["backend"] == {"kind": "vllm", "version": version, "system_fingerprint": truth.system_fingerprint}
    assert r["backend"]["version"] and truth.system_fingerprint
    assert r["sampling"]["logprobs_mode"] == "processed_logprobs"
    assert r["weight_versions"] == truth.weight_versions  # as the backend gave them
