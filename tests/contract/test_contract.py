"""Contract tests: the same assertions against the scripted upstream (`integration`) and a real vLLM (`vllm`), for
each of the four protocols, JSON and streaming, with the official SDKs reaching the gateway through HTTPS_PROXY
like an agent. The truth is what the recording relay saw the backend send (see conftest.py).

Scenarios:
1. An answer (natural end, or cut by max_tokens): the record's prompt ids equal POST /tokenize for the upstream
   messages/tools and the backend's first-chunk ids; completion ids and logprobs equal what the backend sent; the
   SDK's usage equals the backend's; finish → the provider's stop reason (stop → end/stop, length → max tokens);
   the record's backend {kind, version, system_fingerprint}, sampling.logprobs_mode and weight_versions.
2. A forced tool call (Anthropic tool_choice any, OpenAI required, Google ANY) comes back in the provider's
   tool-call shape, equal to what the backend's tool parser sent.
3. max_tokens larger than the context is clamped to max_model_len − prompt_len (record normalization) and the call
   succeeds; a prompt longer than the context gets the provider's context-length error (docs/architecture.md) and a
   record with `error` set.
"""

from __future__ import annotations

import array
import json
from dataclasses import dataclass, field

import anthropic
import httpx
import msgpack
import openai
import orjson
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gtypes

from polar import records as rec

PROTOCOLS = ("anthropic_messages", "openai_chat", "openai_responses", "google_generate")
MODES = ("json", "stream")
PROMPT = "Say hi."
SCHEMA = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"],
          "additionalProperties": False}
TOOL_NAME, TOOL_DESC = "get_weather", "The weather, in a unit"
# A grammar-forced call on a random model may wander through allowed whitespace: room enough to close the JSON.
TOOL_MAX_TOKENS = 1024
TIMEOUT = 120.0


@dataclass
class Result:
    """What the agent saw, protocol-free."""

    text: str
    tool_calls: list[tuple[str, dict]]
    input_tokens: int
    output_tokens: int
    stop: str  # the provider's stop reason as the codecs' provider_stop_reason spells it
    start_input_tokens: int | None = None  # Anthropic message_start
    raw: object = None
    extra: dict = field(default_factory=dict)


# -- the four agents ----------------------------------------------------------------------------------------------


def _anthropic(text: str, max_tokens: int, stream: bool, force_tool: bool) -> Result:
    client = anthropic.Anthropic(api_key="sk-ant-contract", max_retries=0, timeout=TIMEOUT)
    kw: dict = {"model": "claude-sonnet-4-6", "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}
    if force_tool:
        kw["tools"] = [{"name": TOOL_NAME, "description": TOOL_DESC, "input_schema": SCHEMA}]
        kw["tool_choice"] = {"type": "any"}
    start = None
    if stream:
        with client.messages.stream(**kw) as s:
            for event in s:
                if event.type == "message_start":
                    start = event.message.usage.input_tokens
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**kw)
    return Result(text="".join(b.text for b in msg.content if b.type == "text"),
                  tool_calls=[(b.name, b.input) for b in msg.content if b.type == "tool_use"],
                  input_tokens=msg.usage.input_tokens, output_tokens=msg.usage.output_tokens, stop=msg.stop_reason,
                  start_input_tokens=start, raw=msg)


def _openai_chat(text: str, max_tokens: int, stream: bool, force_tool: bool) -> Result:
    client = openai.OpenAI(api_key="sk-contract", max_retries=0, timeout=TIMEOUT)
    kw: dict = {"model": "gpt-4o", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    if force_tool:
        kw["tools"] = [{"type": "function", "function": {"name": TOOL_NAME, "description": TOOL_DESC,
                                                          "parameters": SCHEMA}}]
        kw["tool_choice"] = "required"
    if not stream:
        resp = client.chat.completions.create(**kw)
        choice = resp.choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        return Result(choice.message.content or "", calls, resp.usage.prompt_tokens, resp.usage.completion_tokens,
                      choice.finish_reason, raw=resp)
    parts, calls, finish, usage = [], {}, None, None
    for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = choice.finish_reason or finish
    assert usage is not None, "include_usage was asked: the stream must end with a usage chunk"
    return Result("".join(parts), [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())],
                  usage.prompt_tokens, usage.completion_tokens, finish)


def _openai_responses(text: str, max_tokens: int, stream: bool, force_tool: bool) -> Result:
    client = openai.OpenAI(api_key="sk-contract", max_retries=0, timeout=TIMEOUT)
    kw: dict = {"model": "gpt-5", "input": text, "max_output_tokens": max_tokens}
    if force_tool:
        kw["tools"] = [{"type": "function", "name": TOOL_NAME, "description": TOOL_DESC, "parameters": SCHEMA,
                        "strict": False}]
        kw["tool_choice"] = "required"
    if stream:
        resp = None
        with client.responses.stream(**kw) as s:
            # The SDK's get_final_response() knows only response.completed; a budget-cut answer ends with
            # response.incomplete, whose parsed event carries the same final Response object.
            for event in s:
                if event.type in ("response.completed", "response.incomplete", "response.failed"):
                    resp = event.response
        assert resp is not None, "the stream ended without a final response event"
    else:
        resp = client.responses.create(**kw)
    calls = [(item.name, json.loads(item.arguments)) for item in resp.output if item.type == "function_call"]
    stop = resp.status if resp.status != "incomplete" else f"incomplete:{resp.incomplete_details.reason}"
    return Result(resp.output_text, calls, resp.usage.input_tokens, resp.usage.output_tokens, stop, raw=resp)


def _google(text: str, max_tokens: int, stream: bool, force_tool: bool) -> Result:
    client = genai.Client(api_key="AIza-contract", http_options=gtypes.HttpOptions(timeout=int(TIMEOUT * 1000)))
    config = gtypes.GenerateContentConfig(
        max_output_tokens=max_tokens,
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True))
    if force_tool:
        config.tools = [gtypes.Tool(function_declarations=[gtypes.FunctionDeclaration(
            name=TOOL_NAME, description=TOOL_DESC, parameters_json_schema=SCHEMA)])]
        config.tool_config = gtypes.ToolConfig(function_calling_config=gtypes.FunctionCallingConfig(mode="ANY"))
    if stream:
        chunks = list(client.models.generate_content_stream(model="gemini-2.5-pro", contents=text, config=config))
    else:
        chunks = [client.models.generate_content(model="gemini-2.5-pro", contents=text, config=config)]
    parts, calls, finish, usage = [], [], None, None
    for c in chunks:
        usage = c.usage_metadata or usage
        for cand in c.candidates or []:
            finish = cand.finish_reason or finish
            for p in (cand.content.parts if cand.content else None) or []:
                if p.function_call is not None:
                    calls.append((p.function_call.name, dict(p.function_call.args or {})))
                elif p.text and not p.thought:
                    parts.append(p.text)
    assert usage is not None and finish is not None
    return Result("".join(parts), calls, usage.prompt_token_count or 0, usage.candidates_token_count or 0,
                  finish.value if hasattr(finish, "value") else str(finish), raw=chunks)


AGENTS = {"anthropic_messages": _anthropic, "openai_chat": _openai_chat, "openai_responses": _openai_responses,
          "google_generate": _google}


def expected_stop(protocol: str, finish: str, stop_reason, tool_calls: bool) -> str:
    """The provider's stop reason for a backend finish, written out independently of the codecs."""
    if protocol == "anthropic_messages":
        if finish == "tool_calls" or tool_calls:
            return "tool_use"
        if finish == "length":
            return "max_tokens"
        return "stop_sequence" if isinstance(stop_reason, str) else "end_turn"
    if protocol == "openai_chat":
        return finish
    if protocol == "openai_responses":
        return "incomplete:max_output_tokens" if finish == "length" else "completed"
    return {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"}[finish]


def context_error(protocol: str, exc: Exception) -> None:
    """The provider's context-length error (the error table in docs/architecture.md): status and body shape."""
    if protocol == "anthropic_messages":
        assert isinstance(exc, anthropic.BadRequestError) and exc.status_code == 400
        assert exc.body["type"] == "error" and exc.body["error"]["type"] == "invalid_request_error"
        assert "prompt is too long" in exc.body["error"]["message"]
    elif protocol in ("openai_chat", "openai_responses"):
        assert isinstance(exc, openai.BadRequestError) and exc.status_code == 400
        assert exc.code == "context_length_exceeded" and exc.body["type"] == "invalid_request_error"
    else:
        assert isinstance(exc, genai_errors.ClientError) and exc.code == 400 and exc.status == "INVALID_ARGUMENT"


def _call_expecting_error(agent, *args) -> Exception:
    try:
        agent(*args)
    except (anthropic.APIStatusError, openai.APIStatusError, genai_errors.APIError) as exc:
        return exc
    raise AssertionError("the call succeeded; a context-length error was expected")


# -- helpers over the record and the relay's truth -----------------------------------------------------------------


def one_record(contract) -> dict:
    records = contract.gateway.records()
    assert len(records) == 1, [(r["protocol"], r["error"]) for r in records]
    return records[0]


def f32(values) -> list[float]:
    return array.array("f", values).tolist()


def backend_version(contract) -> str | None:
    r = httpx.get(contract.root_url + "/version", timeout=10, trust_env=False)
    return r.json().get("version") if r.status_code == 200 else None


def assert_record_matches_backend(contract, r: dict, ex, protocol: str, stream: bool) -> None:
    truth = ex.truth()
    upstream = orjson.loads(r["upstream_request"])
    assert upstream == ex.json(), "the record's upstream_request is exactly the body the backend received"
    assert (r["protocol"], r["stream"], r["error"], r["provider_status"]) == (protocol, stream, None, 200)
    assert r["session"] == "contract" and r["session_source"] == "proxy_auth"
    # 1: prompt ids = /tokenize of the same upstream messages/tools = the backend's own prompt ids.
    prompt = rec.token_ids(r, "prompt_token_ids")
    assert prompt and prompt == contract.tokenize_chat(upstream)
    assert prompt == truth.prompt_token_ids
    # 1b: kept as the backend's own digits (the fast path, record v3), exactly as they came over the wire
    ids = r["prompt_token_ids"]
    assert isinstance(ids, msgpack.ExtType) and ids.code == rec.ASCII_IDS, "the prompt ids took the fast path"
    assert b'"prompt_token_ids":[' + ids.data + b"]" in ex.response_body
    # 2: completion ids and logprobs = what the backend sent, one logprob per id.
    completion = rec.token_ids(r, "completion_token_ids")
    assert completion and completion == truth.completion_ids
    assert rec.unpack_floats(r["completion_logprobs"]) == f32(truth.logprobs)
    assert len(truth.logprobs) == len(completion)
    assert (r["finish_reason"], r["stop_reason"], r["usage"]) == (truth.finish_reason, truth.stop_reason, truth.usage)
    assert truth.usage["prompt_tokens"] == len(prompt) and truth.usage["completion_tokens"] == len(completion)
    # Issue item 6: backend identity, logprobs mode, weight versions as given.
    assert r["backend"] == {"kind": "vllm", "version": backend_version(contract),
                            "system_fingerprint": truth.system_fingerprint}
    assert r["backend"]["version"] and truth.system_fingerprint
    assert r["sampling"]["logprobs_mode"] == "raw_logprobs"
    assert r["weight_versions"] == truth.weight_versions
    assert r["model_served"] == contract.model


def assert_usage_and_stop(protocol: str, res: Result, r: dict, ex, stream: bool) -> None:
    truth = ex.truth()
    assert (res.input_tokens, res.output_tokens) == (truth.usage["prompt_tokens"], truth.usage["completion_tokens"])
    want = expected_stop(protocol, truth.finish_reason, truth.stop_reason, bool(truth.tool_calls))
    assert res.stop == want == r["provider_stop_reason"]
    if protocol == "anthropic_messages" and stream:
        assert res.start_input_tokens == truth.usage["prompt_tokens"], "message_start carries the real input tokens"


# -- 1. answers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", ["natural", "length"])
def test_1_answer_tokens_usage_and_finish_match_the_backend(agent_env, protocol, mode, case):
    contract, stream = agent_env, mode == "stream"
    since = contract.mark()
    # "natural": room to end on its own (the scripted reply does; a random model may still hit the cap);
    # "length": a cap below any answer, so the finish must be `length` on both backends.
    res = AGENTS[protocol](PROMPT, 16 if case == "natural" else 2, stream, False)
    ex = contract.chat_exchange(since)
    r = one_record(contract)
    assert_record_matches_backend(contract, r, ex, protocol, stream)
    assert_usage_and_stop(protocol, res, r, ex, stream)
    truth = ex.truth()
    if case == "length":
        # A random model may sample EOS within 2 tokens (p ~ 1/1000); the mapping above held either way.
        assert truth.finish_reason == "length" and len(truth.completion_ids) == 2 or (
            contract.name == "vllm" and truth.finish_reason == "stop" and len(truth.completion_ids) <= 2)
    if contract.name == "scripted" and case == "natural":
        assert truth.finish_reason == "stop"  # the stand-in's answer ends with EOS inside the cap
    assert res.text == truth.content, "the agent gets the backend's text"
    assert ex.json()["max_tokens"] == r["sampling"]["max_tokens_requested"] == (16 if case == "natural" else 2)


# -- 2. forced tool call -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_2_forced_tool_call_comes_back_in_the_providers_shape(agent_env, protocol, mode):
    contract, stream = agent_env, mode == "stream"
    since = contract.mark()
    res = AGENTS[protocol](PROMPT, TOOL_MAX_TOKENS, stream, True)
    ex = contract.chat_exchange(since)
    sent = ex.json()
    assert sent["tool_choice"] == "required" and sent["tools"][0]["function"]["name"] == TOOL_NAME
    truth = ex.truth()
    assert truth.finish_reason == "tool_calls", (truth.finish_reason, len(truth.completion_ids or ()),
                                                 truth.content[:200], truth.tool_calls[:3])
    backend_calls = [(c["name"], json.loads(c["arguments"])) for c in truth.tool_calls]
    assert backend_calls and backend_calls[0][1]["unit"] in ("c", "f")
    assert res.tool_calls == backend_calls, "the provider's tool-call shape carries the backend's call"
    r = one_record(contract)
    assert_record_matches_backend(contract, r, ex, protocol, stream)
    assert_usage_and_stop(protocol, res, r, ex, stream)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in r["assistant"]["tool_calls"]] \
        == backend_calls
    if protocol == "openai_responses":
        assert all(i.call_id for i in res.raw.output if i.type == "function_call")


# -- 3. context limits ---------------------------------------------------------------------------------------------


def _filler(contract, tokens: int) -> str:
    """Plain text of about `tokens` tokens in the backend's own tokenizer."""
    unit = " the cat sat"
    per_unit = contract.count_text(unit * 100) / 100
    return (unit * int(tokens / per_unit)).strip()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_3_1_max_tokens_beyond_the_context_is_clamped_and_the_call_succeeds(agent_env, protocol, mode):
    contract, stream = agent_env, mode == "stream"
    L = contract.max_model_len
    # A prompt that leaves ~24 tokens of room, so the clamped generation is short on a model that never stops.
    text = _filler(contract, L - 80)
    since = contract.mark()
    res = AGENTS[protocol](text, 4 * L, stream, False)
    ex = contract.chat_exchange(since)
    r = one_record(contract)
    prompt_len = len(rec.token_ids(r, "prompt_token_ids"))
    assert 0 < L - prompt_len < 200, (L, prompt_len)
    room = L - prompt_len
    assert ex.json()["max_tokens"] == room and r["sampling"]["max_tokens"] == room
    assert r["sampling"]["max_tokens_requested"] == 4 * L
    assert f"max_tokens_clamped:{4 * L}->{room}" in r["normalizations"]
    assert_record_matches_backend(contract, r, ex, protocol, stream)
    assert_usage_and_stop(protocol, res, r, ex, stream)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_3_2_a_prompt_longer_than_the_context_gets_the_providers_context_error(agent_env, protocol, mode):
    contract, stream = agent_env, mode == "stream"
    L = contract.max_model_len
    text = _filler(contract, L + 200)
    since = contract.mark()
    exc = _call_expecting_error(AGENTS[protocol], text, 16, stream, False)
    context_error(protocol, exc)
    assert contract.relay.chats(since) == [], "rejected before any generation"
    r = one_record(contract)
    assert r["provider_status"] == 400 and r["protocol"] == protocol
    assert r["error"]["type"] == "context_overflow" and r["error"]["status"] == 400
    assert str(L - 1) in r["error"]["message"] or str(L) in r["error"]["message"]
    assert r["prompt_token_ids"] is None and r["completion_token_ids"] is None
