"""SGLang as the backend (issue item 5): a STAND-IN — the scripted upstream in SGLang 0.5.23's wire format as its
source declares it (tests/support/sglang_upstream.py: written from the PyPI wheel's protocol.py and serving_chat.py,
not recorded from a running SGLang; none runs here) — behind the recording relay and the real gateway, with
`polar_backend=auto` (kind from /v1/models `owned_by`) and `polar_backend=sglang`. What these tests verify is the
gateway against that reading of the wire, not against a real SGLang. Through each protocol, JSON and streaming, with
the official SDKs:

0. The stand-in's stream has the shape the source declares (test_0): the sglext chunk (choices [], output_ids one
   list per choice) after the finish chunk and before the usage chunk.
1. The gateway asks SGLang's way — the `x-sglext-return-*` headers, no `return_token_ids` in the streamed body — and
   the record carries the prompt/completion ids from the trailing `sglext` chunk and the per-chunk logprobs, exactly
   as the backend sent them; `backend` is {kind: sglang, version, system_fingerprint: null}.
2. The agent gets the backend's usage (input tokens arrive only at the end of SGLang's stream: the closing usage
   carries them) and the right stop reason; reasoning sent as `reasoning_content` reaches the agent. A forced tool
   call and a max_tokens cut come through each protocol too.
3. max_tokens beyond the context: SGLang's /tokenize cannot count chat messages, so the gateway clamps against the
   prompt's upper bound (normalization `prompt_len_upper_bound`) instead of failing the call.
4. `matched_stop`: a stop string becomes the record's stop_reason (Anthropic stop_sequence); the EOS id does not
   (null stop_reason = EOS, as with vLLM).
"""

from __future__ import annotations

import array
import json

import orjson
import pytest

from polar import records as rec
from tests.contract.test_contract import AGENTS, PROTOCOLS, expected_stop
from tests.support.gateway import relayed_gateway
from tests.support.recording_relay import RecordingRelay
from tests.support.scripted_upstream import Reply
from tests.support.sglang_upstream import INPUT_IDS_HEADER, OUTPUT_IDS_HEADER, SGLANG_VERSION, SGLangUpstream

pytestmark = pytest.mark.integration


class _SGLangStack:
    def __init__(self, upstream: SGLangUpstream, relay: RecordingRelay, gateway):
        self.upstream, self.relay, self.gateway = upstream, relay, gateway


@pytest.fixture(scope="module", params=["auto", "sglang"])
def sglang(request, tokenizer_dir, tmp_path_factory):
    with SGLangUpstream(tokenizer_dir) as up, \
            relayed_gateway(up.root_url, tmp_path_factory.mktemp(f"sglang-{request.param}"),
                            sets=[f"polar_backend={request.param}"]) as (relay, gateway):
        yield _SGLangStack(up, relay, gateway)


@pytest.fixture
def sglang_env(sglang, monkeypatch):
    sglang.upstream.reset()
    sglang.gateway.mark()
    sglang.gateway.apply_env(monkeypatch, "sglang-session")
    return sglang


def f32(values) -> list[float]:
    return array.array("f", values).tolist()


def test_0_the_stand_ins_stream_has_the_shape_sglang_0_5_23_declares(sglang_env):
    """What the stand-in must keep, each item read in SGLang 0.5.23's serving_chat.py / protocol.py: ids only in a
    response-level sglext chunk (`choices: []`), `output_ids` one list per choice (SglExt: List[List[int]]), that
    chunk after the finish chunk and before the usage chunk; the finish reason in a chunk of its own with
    `matched_stop`; reasoning as `reasoning_content`; no `system_fingerprint`."""
    stack = sglang_env
    stack.upstream.script(Reply(text="Hello from SGLang.", reasoning="Think first."))
    since = stack.relay.mark()
    AGENTS["openai_chat"]("Say hi.", 64, True, False)
    (ex,) = stack.relay.chats(since)
    chunks = ex.chunks
    kinds = ["sglext" if "sglext" in c else "usage" if c.get("usage") else
             "finish" if c["choices"] and c["choices"][0]["finish_reason"] else "content" for c in chunks]
    assert kinds[-3:] == ["finish", "sglext", "usage"] and set(kinds[:-3]) == {"content"}, kinds
    finish, ext = chunks[-3], chunks[-2]
    assert finish["choices"][0]["delta"] == {} and "matched_stop" in finish["choices"][0]
    assert ext["choices"] == [] and set(ext["sglext"]) == {"input_ids", "output_ids"}
    assert [len(x) for x in ext["sglext"]["output_ids"]] == [len(stack.upstream.responses[-1].completion_ids)]
    assert any("reasoning_content" in c["choices"][0]["delta"] for c in chunks if c["choices"])
    assert not any("system_fingerprint" in c or "token_ids" in c for c in chunks)


@pytest.mark.parametrize("mode", ["json", "stream"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_1_record_has_sglang_ids_and_logprobs_and_the_agent_gets_the_backends_usage(sglang_env, protocol, mode):
    stack, stream = sglang_env, mode == "stream"
    stack.upstream.script(Reply(text="Hello from SGLang.", reasoning="Think first."))
    since = stack.relay.mark()
    res = AGENTS[protocol]("Say hi.", 64, stream, False)
    chats = stack.relay.chats(since)
    assert len(chats) == 1
    ex = chats[0]
    sent = ex.json()
    # 1: SGLang's way of asking for ids.
    assert ex.request_headers.get(INPUT_IDS_HEADER) == "1" and ex.request_headers.get(OUTPUT_IDS_HEADER) == "1"
    assert "return_token_ids" not in sent and "return_weight_versions" not in sent
    assert sent["stream"] is True and sent["logprobs"] is True
    chunks = ex.chunks
    assert not any("token_ids" in c or "prompt_token_ids" in c for c in chunks)
    [ext] = [c for c in chunks if "sglext" in c]  # one sglext chunk, at response level (choices [])
    truth = ex.truth()
    answer = stack.upstream.responses[-1]
    assert truth.prompt_token_ids == answer.prompt_token_ids and truth.completion_ids == answer.completion_ids
    records = stack.gateway.records()
    assert len(records) == 1, [r["error"] for r in records]
    r = records[0]
    assert r["error"] is None and r["provider_status"] == 200
    assert orjson.loads(r["upstream_request"]) == sent
    assert rec.token_ids(r, "prompt_token_ids") == truth.prompt_token_ids
    assert rec.token_ids(r, "completion_token_ids") == truth.completion_ids
    assert rec.unpack_floats(r["completion_logprobs"]) == f32(truth.logprobs)
    assert len(truth.logprobs) == len(truth.completion_ids)
    assert "backend_gave_no_token_ids" not in r["normalizations"]
    assert r["backend"] == {"kind": "sglang", "version": SGLANG_VERSION, "system_fingerprint": None}
    assert r["sampling"]["logprobs_mode"] == "raw_logprobs" and r["weight_versions"] is None
    assert r["assistant"]["reasoning"] == answer.reasoning and "Think first." in answer.reasoning
    # 2: the agent's usage and stop reason are the backend's.
    assert (res.input_tokens, res.output_tokens) == (truth.usage["prompt_tokens"], truth.usage["completion_tokens"])
    assert truth.usage["prompt_tokens"] == len(truth.prompt_token_ids)
    assert truth.finish_reason == "stop"
    assert res.stop == expected_stop(protocol, "stop", None, False) == r["provider_stop_reason"]
    assert res.text.strip() == "Hello from SGLang."
    if protocol == "anthropic_messages" and stream:
        # SGLang sends the prompt ids only at the end and cannot count chat messages beforehand: message_start says
        # 0 (never a wrong number) and the closing message_delta carries the real count (docs/architecture.md, step 5 of
        # one call).
        assert res.start_input_tokens in (0, truth.usage["prompt_tokens"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_2_forced_tool_call_and_length_cut_through_sglang(sglang_env, protocol):
    stack = sglang_env
    since = stack.relay.mark()
    res = AGENTS[protocol]("Say hi.", 256, True, True)
    ex = stack.relay.chats(since)[0]
    truth = ex.truth()
    assert truth.finish_reason == "tool_calls"
    assert res.tool_calls == [(c["name"], json.loads(c["arguments"])) for c in truth.tool_calls]
    res2 = AGENTS[protocol]("Say hi.", 2, True, False)
    assert res2.stop == expected_stop(protocol, "length", None, False)
    records = stack.gateway.records()
    assert len(records) == 2 and all(r["error"] is None for r in records)
    for r in records:
        assert rec.token_ids(r, "prompt_token_ids") and rec.token_ids(r, "completion_token_ids")
    assert len(rec.token_ids(records[1], "completion_token_ids")) == 2 == res2.output_tokens


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_3_max_tokens_beyond_the_context_is_clamped_without_a_chat_tokenize(sglang_env, protocol):
    # SGLang's /tokenize takes text only, so the prompt cannot be counted before the call: the gateway clamps
    # against the prompt's upper bound (bytes of the messages + template allowance) instead of failing the call.
    stack = sglang_env
    L = stack.upstream.max_model_len
    since = stack.relay.mark()
    res = AGENTS[protocol]("Say hi.", 2 * L, False, False)
    ex = stack.relay.chats(since)[0]
    sent_max = ex.json()["max_tokens"]
    truth = ex.truth()
    assert 0 < sent_max < L - len(truth.prompt_token_ids), "clamped, with the prompt still fitting"
    r = stack.gateway.records()[-1]
    assert r["error"] is None and "prompt_len_upper_bound" in r["normalizations"]
    assert f"max_tokens_clamped:{2 * L}->{sent_max}" in r["normalizations"]
    assert res.output_tokens == truth.usage["completion_tokens"]


def matched_stops(stack) -> list:
    chunks = stack.relay.chats()[-1].chunks
    return [c["choices"][0]["matched_stop"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]


def test_4_a_matched_stop_string_is_the_records_stop_reason_and_anthropics_stop_sequence(sglang_env):
    import anthropic

    stack = sglang_env
    stack.upstream.script(Reply(text="Hello there, friend of mine."))
    msg = anthropic.Anthropic(api_key="sk-ant-contract", max_retries=0, timeout=60).messages.create(
        model="claude-sonnet-4-6", max_tokens=64, stop_sequences=["friend"],
        messages=[{"role": "user", "content": "Say hi."}])
    assert matched_stops(stack) == ["friend"]
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "friend")
    (r,) = stack.gateway.records()
    assert (r["finish_reason"], r["stop_reason"]) == ("stop", "friend")
    # A natural end: matched_stop is the EOS id, and the record keeps vLLM's meaning (null = EOS).
    stack.gateway.mark()
    stack.upstream.script(Reply(text="Bye."))
    AGENTS["anthropic_messages"]("Say bye.", 64, False, False)
    (r,) = stack.gateway.records()
    (eos,) = matched_stops(stack)
    assert isinstance(eos, int) and rec.token_ids(r, "completion_token_ids")[-1] == eos
    assert (r["finish_reason"], r["stop_reason"]) == ("stop", None)
