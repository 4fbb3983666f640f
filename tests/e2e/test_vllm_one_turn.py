"""One turn per real CLI against the real tiny vLLM model (64k context) through the gateway: exit 0 and a complete
record.

The random model rarely samples its end-of-turn id (1 in ~3k), so an answer would run for thousands of tokens on a
CPU, and a length cut is an error for some CLIs (Claude Code exits 1 on `max_tokens`). The server is started with a
generation config (`--generation-config DIR`, vLLM's own mechanism) that lists extra end-of-turn ids: an answer then
ends naturally (finish `stop`) after ~8 tokens, with `max_new_tokens` as a server-wide backstop."""

from __future__ import annotations

import pytest

from polar.records import token_ids, unpack_floats
from tests.e2e.conftest import Agents, process_session, require_cli
from tests.support.gateway import start_gateway
from tests.support.vllm_server import EXTRA_EOS_MAX_NEW_TOKENS, shared_extra_eos_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

MAX_NEW_TOKENS = EXTRA_EOS_MAX_NEW_TOKENS
# Gemini CLI's router call asks for JSON with a free string; a random model never closes it within the cap and the
# CLI would retry for minutes. An explicit model skips the router (its JSON answer is covered by test_gemini_cli).
# The two CLIs that honour a base-URL variable also run by base URL (run-agent --connect base-url: no proxy, no CA).
CASES = [
    ("claude-code", None, None, "anthropic_messages", "proxy"),
    ("claude-code", None, None, "anthropic_messages", "base-url"),
    ("codex", None, None, "openai_responses", "proxy"),
    ("gemini-cli", None, "gemini-2.5-flash", "google_generate", "proxy"),
    ("qwen-code", None, None, "openai_chat", "proxy"),
    ("qwen-code", None, None, "openai_chat", "base-url"),
    ("pi", "anthropic", None, "anthropic_messages", "proxy"),
    ("pi", "openai", None, "openai_responses", "proxy"),
    ("pi", "google", None, "google_generate", "proxy"),
]


@pytest.fixture(scope="module")
def vllm_gateway(tmp_path_factory):
    server, gen = shared_extra_eos_vllm()  # shared with tests/rollout/test_cli_vllm.py: one start per session
    base = tmp_path_factory.mktemp("vllm-gateway")
    with start_gateway(server.base_url, str(base / "run"), str(base / "flows")) as handle:
        handle.generation_config = gen  # the extra end-of-turn ids polar-process must know
        yield server, handle


@pytest.mark.parametrize("harness,provider,model,protocol,connect", CASES,
                         ids=[(f"{h}-{p}" if p else h) + ("-base-url" if c == "base-url" else "")
                              for h, p, _, _, c in CASES])
def test_1_one_turn_against_tiny_vllm(vllm_gateway, tmp_path, harness, provider, model, protocol, connect):
    require_cli(harness)
    server, gateway = vllm_gateway
    gateway.mark()
    run = Agents(gateway, tmp_path).run(harness, "Say hi.", provider=provider, model=model, timeout=300,
                                        connect=connect)
    assert run.returncode == 0, run.explain()
    records = gateway.records()
    assert records, run.explain()
    for r in records:
        assert (r["session"], r["session_source"], r["connect"]) == (
            run.session, "proxy_auth" if connect == "proxy" else "path", connect.replace("-", "_"))
        assert r["protocol"] == protocol and r["error"] is None, (r["path"], r["error"])
        assert r["model_served"] == server.model
        completion = token_ids(r, "completion_token_ids")
        assert completion and len(completion) <= MAX_NEW_TOKENS
        logprobs = unpack_floats(r["completion_logprobs"])
        assert logprobs is not None and len(logprobs) == len(completion) and all(x <= 0.0 for x in logprobs)
        assert r["finish_reason"] in ("stop", "tool_calls"), r["finish_reason"]
        assert r["usage"]["completion_tokens"] == len(completion)
        prompt = token_ids(r, "prompt_token_ids")
        if prompt is not None:
            assert r["usage"]["prompt_tokens"] == len(prompt) <= server.max_model_len
    if connect == "base-url":  # processed as the proxy path's records are: every call in a sequence, all trainable
        processed = process_session(gateway, run.session, tmp_path / "out",
                                    [f"--tokenizer={gateway.generation_config}"])
        assert sum(s["n_calls"] for s in processed.sequences) == len(records) == len(processed.calls)
        assert sum(s["n_trainable"] for s in processed.sequences) == sum(
            len(token_ids(r, "completion_token_ids")) for r in records)
