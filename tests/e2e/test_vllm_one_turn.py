"""One turn per real CLI against the real tiny vLLM model (64k context) through the gateway: exit 0 and a complete
record. The random model's answers are capped server-wide (`max_new_tokens`), so a turn ends fast on a CPU."""

from __future__ import annotations

import os

import pytest

from polar.addon.record import token_ids, unpack_floats
from tests.e2e.conftest import Agents, require_cli
from tests.support.gateway import start_gateway

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

MAX_NEW_TOKENS = 24
# Gemini CLI's router call asks for JSON with a free string; a random model never closes it within the cap and the
# CLI would retry for minutes. An explicit model skips the router (its JSON answer is covered by test_gemini_cli).
CASES = [
    ("claude-code", None, None, "anthropic_messages"),
    ("codex", None, None, "openai_responses"),
    ("gemini-cli", None, "gemini-2.5-flash", "google_generate"),
    ("qwen-code", None, None, "openai_chat"),
    ("pi", "anthropic", None, "anthropic_messages"),
    ("pi", "openai", None, "openai_responses"),
    ("pi", "google", None, "google_generate"),
]


@pytest.fixture(scope="module")
def vllm_gateway(tmp_path_factory):
    from tests.support.vllm_server import start_vllm, stop_vllm

    server = start_vllm("tiny", extra=("--override-generation-config", f'{{"max_new_tokens": {MAX_NEW_TOKENS}}}'))
    base = tmp_path_factory.mktemp("vllm-gateway")
    try:
        handle = start_gateway(server.base_url, str(base / "run"), str(base / "flows"))
    except Exception:
        stop_vllm(server)
        raise
    yield server, handle
    handle.stop()
    stop_vllm(server)


@pytest.mark.parametrize("harness,provider,model,protocol", CASES,
                         ids=[f"{h}-{p}" if p else h for h, p, _, _ in CASES])
def test_1_one_turn_against_tiny_vllm(vllm_gateway, tmp_path, harness, provider, model, protocol):
    require_cli(harness)
    server, gateway = vllm_gateway
    gateway.mark()
    run = Agents(gateway, tmp_path).run(harness, "Say hi.", provider=provider, model=model, timeout=300)
    assert run.returncode == 0, run.explain()
    records = gateway.records()
    assert records, run.explain()
    for r in records:
        assert (r["session"], r["session_source"]) == (run.session, "proxy_auth")
        assert r["protocol"] == protocol and r["error"] is None, (r["path"], r["error"])
        assert r["model_served"] == server.model
        completion = token_ids(r, "completion_token_ids")
        assert completion and len(completion) <= MAX_NEW_TOKENS
        logprobs = unpack_floats(r["completion_logprobs"])
        assert logprobs is not None and len(logprobs) == len(completion) and all(x <= 0.0 for x in logprobs)
        assert r["finish_reason"] in ("stop", "length", "tool_calls")
        assert r["usage"]["completion_tokens"] == len(completion)
        prompt = token_ids(r, "prompt_token_ids")
        if prompt is not None:
            assert r["usage"]["prompt_tokens"] == len(prompt) <= server.max_model_len
