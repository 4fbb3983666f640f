"""Anthropic Messages codec: routing, request translation, and the SSE / JSON answers checked by the official SDK.

1.x routing and sessions · 2.x to_chat · 3.x streaming under arbitrary re-chunking · 4.x non-streaming answers
5.x errors · 6.x SDK round trips (count_tokens, two-turn tool use) · 7.x real Claude Code captures
"""

from __future__ import annotations

import glob
import json
import os

import anthropic
import httpx2  # the anthropic SDK (2.x) runs on httpx2 and rejects httpx objects
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from polar.addon.codecs import anthropic as codec
from polar.addon.codecs.base import (
    AgentInputError,
    Completion,
    Delta,
    EncodeContext,
    GatewayError,
    Route,
    ToolCall,
    ToolCallDelta,
)

pytestmark = pytest.mark.unit

GEN = Route(codec.PROTOCOL, "generate")
COUNT = Route(codec.PROTOCOL, "count_tokens")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CAPTURES = os.path.join(ROOT, "..", "shared", "captures")
EVENT = TypeAdapter(anthropic.types.RawMessageStreamEvent)


def body(**kw) -> dict:
    base = {"model": "claude-test", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    base.update(kw)
    return base


def plan_of(**kw):
    return codec.to_chat(body(**kw), GEN)


def sdk(handler) -> anthropic.Anthropic:
    """The official client, answering from `handler` without sockets."""
    return anthropic.Anthropic(api_key="k", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def encoder(plan=None, prompt_tokens: int | None = 7) -> codec.Encoder:
    plan = plan or plan_of()
    return codec.Encoder(EncodeContext(plan, GEN, "rid123", model="claude-test", prompt_tokens=prompt_tokens,
                                       created=1))


def stream_bytes(enc: codec.Encoder, deltas, completion: Completion) -> bytes:
    out = enc.start()
    for d in deltas:
        out += enc.delta(d)
    out += enc.finish(completion)
    return b"".join(out)


def sse_reply(payload: bytes):
    return lambda request: httpx2.Response(200, content=payload, headers={"content-type": codec.STREAM_CONTENT_TYPE})


def parse_events(payload: bytes) -> list[tuple[str, dict]]:
    events = []
    for chunk in payload.decode().split("\n\n"):
        if chunk:
            lines = dict(line.split(": ", 1) for line in chunk.split("\n"))
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def final_message(payload: bytes) -> anthropic.types.Message:
    client = sdk(sse_reply(payload))
    with client.messages.stream(model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "x"}]) as s:
        return s.get_final_message()


# ------------------------------------------------------------------------------------------- 1.x routing, sessions

@pytest.mark.parametrize("method,host,path,kind", [
    ("POST", "api.anthropic.com", "/v1/messages", "generate"),
    ("POST", "api.anthropic.com", "/v1/messages?beta=true", "generate"),
    ("POST", "API.Anthropic.com:443", "/v1/messages", "generate"),
    ("POST", "api.anthropic.com", "/v1/messages/count_tokens?beta=true", "count_tokens"),
    ("GET", "api.anthropic.com", "/v1/messages", "not_found"),
    ("GET", "api.anthropic.com", "/v1/models", "not_found"),
    ("POST", "api.anthropic.com", "/api/event_logging/batch", "not_found"),
])
def test_1_1_routes_on_the_anthropic_host(method, host, path, kind):
    r = codec.route(method, host, path, {})
    assert r is not None and r.protocol == "anthropic_messages" and r.kind == kind


@pytest.mark.parametrize("host", ["api.openai.com", "anthropic.com", "api.anthropic.com.evil.test"])
def test_1_2_other_hosts_are_not_ours(host):
    assert codec.route("POST", host, "/v1/messages", {}) is None


def test_1_3_session_from_the_claude_code_header_in_any_header_shape():
    for headers in ({"X-Claude-Code-Session-Id": "s-1"}, [("x-claude-code-session-id", "s-1")],
                    [(b"X-Claude-Code-Session-Id", b"s-1")]):
        key = codec.session_key(headers, body(metadata={"user_id": json.dumps({"session_id": "other"})}))
        assert (key.source, key.value) == ("harness:x-claude-code-session-id", "s-1")


def test_1_4_session_from_metadata_user_id_else_none():
    key = codec.session_key({}, body(metadata={"user_id": json.dumps({"device_id": "d", "session_id": "s-2"})}))
    assert (key.source, key.value) == ("harness:metadata.user_id", "s-2")
    legacy = codec.session_key({}, body(metadata={"user_id": "user_ab12_account__session_0b1c-2d"}))
    assert legacy.value == "0b1c-2d"
    assert codec.session_key({}, body(metadata={"user_id": "just-a-user"})) is None
    assert codec.session_key({}, body(metadata={"user_id": json.dumps({"device_id": "d"})})) is None
    assert codec.session_key({}, body()) is None
    assert codec.session_key({}, None) is None


# ---------------------------------------------------------------------------------------------------- 2.x to_chat

def test_2_1_system_string_and_blocks_billing_header_removed():
    p = plan_of(system="be brief")
    assert p.chat["messages"][0] == {"role": "system", "content": "be brief"}
    p = plan_of(system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab;"},
                        {"type": "text", "text": "one"},
                        {"type": "text", "text": "two", "cache_control": {"type": "ephemeral"}}])
    assert p.chat["messages"][0] == {"role": "system", "content": "one\n\ntwo"}
    assert "removed_billing_header" in p.normalizations and "ignored_cache_control" in p.normalizations
    only_billing = plan_of(system=[{"type": "text", "text": "x-anthropic-billing-header: a"}])
    assert only_billing.chat["messages"] == [{"role": "user", "content": "hi"}]


def test_2_2_mid_conversation_system_messages_stay_in_place():
    p = plan_of(messages=[{"role": "user", "content": "a"}, {"role": "system", "content": "note"},
                          {"role": "assistant", "content": "b"},
                          {"role": "system", "content": [{"type": "text", "text": "n2"}]},
                          {"role": "user", "content": "c"}])
    assert [(m["role"], m["content"]) for m in p.chat["messages"]] == [
        ("user", "a"), ("system", "note"), ("assistant", "b"), ("system", "n2"), ("user", "c")]


def test_2_3_user_blocks_text_and_images():
    p = plan_of(messages=[{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}]}])
    assert p.chat["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]
    text_only = plan_of(messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]}])
    assert text_only.chat["messages"] == [{"role": "user", "content": "a\n\nb"}]


def test_2_4_tool_use_and_tool_results_in_order_before_user_text():
    p = plan_of(messages=[
        {"role": "user", "content": "run"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls", "n": 1}},
            {"type": "tool_use", "id": "t2", "name": "Read", "input": {}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "reminder"},
            {"type": "tool_result", "tool_use_id": "t1", "content": "files"},
            {"type": "tool_result", "tool_use_id": "t2", "is_error": True,
             "content": [{"type": "text", "text": "no such file"},
                         {"type": "image", "source": {"type": "url", "url": "https://x.test/i.png"}}]}]}])
    m = p.chat["messages"]
    assert m[1] == {"role": "assistant", "content": "ok", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls", "n": 1}'}},
        {"id": "t2", "type": "function", "function": {"name": "Read", "arguments": "{}"}}]}
    assert m[2] == {"role": "tool", "tool_call_id": "t1", "content": "files"}
    assert m[3] == {"role": "tool", "tool_call_id": "t2", "content": [
        {"type": "text", "text": "Error: no such file"},
        {"type": "image_url", "image_url": {"url": "https://x.test/i.png"}}]}
    assert m[4] == {"role": "user", "content": "reminder"}
    assert len(m) == 5
    assert {"reordered_tool_results", "tool_result_error_prefixed"} <= set(p.normalizations)


def test_2_5_tool_only_assistant_has_null_content_and_empty_results_are_empty_strings():
    p = plan_of(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "é"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}])
    assert p.chat["messages"][1]["content"] is None
    assert p.chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a": "é"}'
    assert p.chat["messages"][2:] == [{"role": "tool", "tool_call_id": "t1", "content": ""}]
    assert "continue_final_message" not in p.chat


def test_2_6_thinking_round_trip_and_redacted_thinking_noted():
    p = plan_of(messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                          {"type": "redacted_thinking", "data": "opaque"},
                                          {"type": "text", "text": "a"}]},
        {"role": "user", "content": "q2"}])
    assert p.chat["messages"][1] == {"role": "assistant", "content": "a", "reasoning_content": "hmm"}
    assert {"redacted_thinking_dropped", "reasoning_dropped"} <= set(p.normalizations)
    omitted_thinking = {"type": "thinking", "thinking": "", "signature": "s"}  # `display: omitted`
    omitted = plan_of(messages=[{"role": "user", "content": "q"},
                                {"role": "assistant", "content": [omitted_thinking, {"type": "text", "text": "a"}]},
                                {"role": "user", "content": "q2"}])
    assert omitted.chat["messages"][1] == {"role": "assistant", "content": "a"}
    assert "reasoning_dropped" in omitted.normalizations


def test_2_7_tools_custom_kept_server_tools_dropped_and_empty_list_fine():
    p = plan_of(tools=[
        {"name": "Bash", "description": "run", "input_schema": {"type": "object"}, "cache_control": {}},
        {"type": "custom", "name": "Read", "input_schema": {"type": "object", "properties": {}}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}])
    assert p.chat["tools"] == [
        {"type": "function", "function": {"name": "Bash", "description": "run", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "Read", "parameters": {"type": "object", "properties": {}}}}]
    assert {"dropped_server_tool:web_search", "dropped_server_tool:bash",
            "dropped_server_tool:str_replace_based_edit_tool"} <= set(p.normalizations)
    assert plan_of(tools=[]).chat["tools"] == []


@pytest.mark.parametrize("choice,expected,constrained", [
    ({"type": "auto"}, "auto", False),
    ({"type": "any"}, "required", True),
    ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}, True),
    ({"type": "none"}, "none", False),
])
def test_2_8_tool_choice(choice, expected, constrained):
    p = plan_of(tools=[{"name": "f", "input_schema": {"type": "object"}}], tool_choice=choice)
    assert p.chat["tool_choice"] == expected and p.constrained is constrained


def test_2_9_disable_parallel_tool_use_noted_and_passed():
    p = plan_of(tools=[{"name": "f", "input_schema": {}}],
                tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert p.chat["parallel_tool_calls"] is False and "disable_parallel_tool_use" in p.normalizations


def test_2_10_sampling_stop_and_max_tokens():
    p = plan_of(temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["END", "\n\nHuman:"], max_tokens=321)
    assert {k: p.chat[k] for k in ("temperature", "top_p", "top_k", "stop", "max_tokens")} == {
        "temperature": 0.2, "top_p": 0.9, "top_k": 40, "stop": ["END", "\n\nHuman:"], "max_tokens": 321}
    assert "temperature" not in plan_of().chat and "stop" not in plan_of(stop_sequences=[]).chat
    assert plan_of(stream=True).stream is True and plan_of().stream is False


@pytest.mark.parametrize("thinking,expected", [
    (None, None), ({"type": "enabled", "budget_tokens": 1024}, True), ({"type": "adaptive"}, True),
    ({"type": "disabled"}, False)])
def test_2_11_thinking_intent_goes_to_extra(thinking, expected):
    p = plan_of(**({"thinking": thinking} if thinking else {}))
    assert p.extra["thinking"] is expected
    assert "chat_template_kwargs" not in p.chat
    if thinking and "budget_tokens" in thinking:
        assert p.extra["thinking_budget_tokens"] == 1024


def test_2_12_output_config_format_and_tolerated_fields():
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    p = plan_of(tools=[], output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"},
                context_management={"edits": []}, metadata={"user_id": "u"}, service_tier="auto",
                container="c1", mcp_servers=[], brand_new_field=1)
    assert p.chat["response_format"] == {"type": "json_schema",
                                         "json_schema": {"name": "output", "schema": schema, "strict": True}}
    assert p.constrained is True
    assert {"ignored:output_config.effort", "ignored:context_management", "ignored:metadata",
            "ignored:service_tier", "ignored:container", "ignored:mcp_servers",
            "ignored:brand_new_field"} <= set(p.normalizations)
    beta = plan_of(output_format={"type": "json_schema", "schema": schema})
    assert beta.chat["response_format"]["json_schema"]["schema"] == schema


def test_2_13_final_assistant_turn_is_a_prefill():
    p = plan_of(messages=[{"role": "user", "content": "json please"}, {"role": "assistant", "content": "{"}])
    assert p.chat["continue_final_message"] is True and p.chat["add_generation_prompt"] is False
    assert p.chat["messages"][-1] == {"role": "assistant", "content": "{"}
    empty = plan_of(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": []}])
    assert empty.chat["messages"] == [{"role": "user", "content": "q"}]
    assert "continue_final_message" not in empty.chat


def test_2_14_count_tokens_tolerates_missing_max_tokens():
    b = body()
    del b["max_tokens"]
    assert "max_tokens" not in codec.to_chat(b, COUNT).chat
    with pytest.raises(AgentInputError, match="max_tokens"):
        codec.to_chat(b, GEN)


@pytest.mark.parametrize("bad,needle", [
    ([1, 2], "JSON object"),
    ({"model": "m", "max_tokens": 5}, "messages: Field required"),
    (body(messages="hi"), "messages"),
    (body(messages=[{"role": "tool", "content": "x"}]), "messages.0.role"),
    (body(messages=[{"role": "user"}]), "messages.0.content"),
    (body(messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]), "thinking"),
    (body(messages=[{"role": "user", "content": [{"type": "video"}]}]), "'video'"),
    (body(messages=[{"role": "user", "content": [{"text": "no type"}]}]), "messages.0.content.0"),
    (body(messages=[{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]), ".id"),
    (body(messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                       "input": "x"}]}]), "input"),
    (body(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]),
     "image source"),
    (body(max_tokens="9"), "max_tokens"),
    (body(max_tokens=0), "max_tokens"),
    (body(temperature="hot"), "temperature"),
    (body(stop_sequences="END"), "stop_sequences"),
    (body(tools={"name": "f"}), "tools"),
    (body(tools=[{"input_schema": {}}]), "tools.0.name"),
    (body(tool_choice={"type": "tool", "name": "missing"}, tools=[]), "tool_choice"),
    (body(tool_choice={"type": "maybe"}), "tool_choice"),
    (body(thinking={"type": "sometimes"}), "thinking"),
    (body(output_config={"format": {"type": "regex"}}), "output_config.format"),
    (body(system=[{"type": "image"}]), "system"),
    (body(stream="yes"), "stream"),
    (body(model=None), "model"),
])
def test_2_15_bad_input_is_a_clear_agent_input_error(bad, needle):
    with pytest.raises(AgentInputError) as info:
        codec.to_chat(bad, GEN)
    assert needle in info.value.message and info.value.kind == "bad_request"


# ---------------------------------------------------------------------------- 3.x streaming, arbitrary re-chunking

def _pieces(draw, text: str) -> list[str]:
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=6))) if len(text) > 1 else []
    bounds = [0, *[c for c in cuts if c < len(text)], len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
ARGS = st.dictionaries(st.text("abcxyz_", min_size=1, max_size=6),
                       st.one_of(st.integers(-5, 5), st.text(max_size=8), st.booleans(), st.none()), max_size=3)


@st.composite
def generations(draw):
    """A backend generation as segments (thinking/text runs, then tool calls) and its Delta stream."""
    segments = draw(st.lists(st.tuples(st.sampled_from(["reasoning", "text"]), TEXT), max_size=4))
    tools = draw(st.lists(st.tuples(st.sampled_from(["Bash", "Read", "f"]), ARGS), max_size=3))
    deltas: list[Delta] = []
    for kind, text in segments:
        deltas += [Delta(**{kind: piece}) for piece in _pieces(draw, text)]
    for i, (name, args) in enumerate(tools):
        pieces = _pieces(draw, json.dumps(args))
        first = pieces.pop(0) if draw(st.booleans()) else ""
        deltas.append(Delta(tool_calls=(ToolCallDelta(i, id=f"chatcmpl-tool-{i}", name=name, arguments=first),)))
        deltas += [Delta(tool_calls=(ToolCallDelta(i, arguments=p),)) for p in pieces]
    deltas.append(Delta(finish_reason="tool_calls" if tools else "stop"))
    if draw(st.booleans()) and len(deltas) > 2:  # a backend chunk may carry reasoning and text together
        a, b = deltas[0], deltas[1]
        if not a.tool_calls and not b.tool_calls and a.reasoning and b.text:
            deltas[:2] = [Delta(reasoning=a.reasoning, text=b.text)]
    return segments, tools, deltas


def expected_blocks(segments, tools) -> list[tuple[str, str]]:
    merged: list[list[str]] = []
    for kind, text in segments:
        if merged and merged[-1][0] == kind:
            merged[-1][1] += text
        else:
            merged.append([kind, text])
    return [("thinking" if k == "reasoning" else "text", t) for k, t in merged] + [("tool_use", n) for n, _ in tools]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generations(), st.integers(1, 5000), st.integers(0, 500))
def test_3_1_sdk_accumulates_any_rechunked_stream(gen, prompt_tokens, completion_tokens):
    segments, tools, deltas = gen
    completion = Completion(
        content="".join(t for k, t in segments if k == "text"),
        reasoning="".join(t for k, t in segments if k == "reasoning"),
        tool_calls=tuple(ToolCall(f"chatcmpl-tool-{i}", n, json.dumps(a)) for i, (n, a) in enumerate(tools)),
        finish_reason="tool_calls" if tools else "stop", stop_reason=None,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    payload = stream_bytes(encoder(prompt_tokens=prompt_tokens), deltas, completion)

    events = parse_events(payload)
    for name, data in events:
        if name != "ping":  # ping is a transport keep-alive outside the SDK's event union
            EVENT.validate_python(data)  # every other event is a valid Anthropic stream event
    names = [e for e, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == prompt_tokens
    starts = [d["index"] for e, d in events if e == "content_block_start"]
    stops = [d["index"] for e, d in events if e == "content_block_stop"]
    assert starts == stops == list(range(len(starts)))

    message = final_message(payload)
    got = [(b.type, b.thinking if b.type == "thinking" else b.text if b.type == "text" else b.name)
           for b in message.content]
    assert got == expected_blocks(segments, tools)
    assert [b.input for b in message.content if b.type == "tool_use"] == [a for _, a in tools]
    assert all(b.signature for b in message.content if b.type == "thinking")
    assert message.stop_reason == ("tool_use" if tools else "end_turn")
    assert (message.usage.input_tokens, message.usage.output_tokens) == (prompt_tokens, completion_tokens)
    assert message.id == "msg_rid123" and message.model == "claude-test"


def test_3_2_text_stream_is_incremental_through_the_sdk():
    enc = encoder()
    deltas = [Delta(text="Hel"), Delta(text="lo"), Delta(text=" world")]
    payload = stream_bytes(enc, deltas, Completion("Hello world", "", (), "stop", None, 7, 3))
    client = sdk(sse_reply(payload))
    with client.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as s:
        assert list(s.text_stream) == ["Hel", "lo", " world"]


def test_3_3_start_carries_the_real_input_tokens_and_final_usage_repeats_them():
    enc = encoder(prompt_tokens=None)  # a backend that reports the prompt only at the end
    payload = stream_bytes(enc, [Delta(text="a")], Completion("a", "", (), "stop", None, 42, 1))
    events = parse_events(payload)
    assert events[0][1]["message"]["usage"]["input_tokens"] == 0
    assert events[-2][1]["usage"] == {"input_tokens": 42, "output_tokens": 1}
    assert final_message(payload).usage.input_tokens == 42


@pytest.mark.parametrize("finish,stop_reason,calls,stops,expected", [
    ("stop", None, (), None, ("end_turn", None)),
    ("stop", 151645, (), None, ("end_turn", None)),
    ("stop", "END", (), ["END"], ("stop_sequence", "END")),
    ("stop", "</x>", (), ["END"], ("end_turn", None)),
    ("length", None, (), None, ("max_tokens", None)),
    ("tool_calls", None, (ToolCall("c1", "f", "{}"),), None, ("tool_use", None)),
    ("stop", None, (ToolCall("c1", "f", "{}"),), None, ("tool_use", None)),  # named tool_choice ends with stop
])
def test_3_4_stop_reason_mapping(finish, stop_reason, calls, stops, expected):
    plan = plan_of(**({"stop_sequences": stops} if stops else {}))
    c = Completion("t", "", calls, finish, stop_reason, 3, 2)
    enc = encoder(plan)
    deltas = [Delta(text="t")] + [Delta(tool_calls=(ToolCallDelta(0, id=k.id, name=k.name, arguments=k.arguments),))
                                  for k in calls]
    message = final_message(stream_bytes(enc, deltas, c))
    assert (message.stop_reason, message.stop_sequence) == expected
    assert codec.provider_stop_reason(c, plan) == expected[0]
    body_ = enc.response(c)
    assert (body_["stop_reason"], body_["stop_sequence"]) == expected


def test_3_5_thinking_block_ends_with_our_signature_before_stop():
    events = parse_events(stream_bytes(encoder(), [Delta(reasoning="r"), Delta(text="t")],
                                       Completion("t", "r", (), "stop", None, 1, 2)))
    kinds = [(e, d.get("delta", {}).get("type")) for e, d in events]
    assert kinds[2:7] == [("content_block_start", None), ("content_block_delta", "thinking_delta"),
                          ("content_block_delta", "signature_delta"), ("content_block_stop", None),
                          ("content_block_start", None)]


def test_3_6_tool_ids_kept_when_valid_else_derived():
    enc = encoder()
    out = enc.delta(Delta(tool_calls=(ToolCallDelta(0, id="call a/b", name="f"),)))
    out += enc.delta(Delta(tool_calls=(ToolCallDelta(1, id=None, name="g", arguments="{}"),)))
    starts = [d["content_block"]["id"] for e, d in parse_events(b"".join(out)) if e == "content_block_start"]
    assert starts == ["toolu_rid123_0", "toolu_rid123_1"]
    assert enc.response(Completion("", "", (ToolCall("chatcmpl-tool-9", "f", "{}"),), "tool_calls", None, 1, 1)
                        )["content"][0]["id"] == "chatcmpl-tool-9"


# ------------------------------------------------------------------------------------------- 4.x non-streaming

def test_4_1_response_is_a_valid_message_for_the_sdk():
    c = Completion("hello", "think", (ToolCall("toolu_1", "Bash", '{"command": "ls"}'),), "tool_calls", None, 11, 5)
    data = encoder().response(c)
    anthropic.types.Message.model_validate(data)
    client = sdk(lambda r: httpx2.Response(200, json=data))
    m = client.messages.create(model="claude-test", max_tokens=9, messages=[{"role": "user", "content": "x"}])
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
    assert m.content[2].input == {"command": "ls"} and m.stop_reason == "tool_use"
    assert (m.usage.input_tokens, m.usage.output_tokens) == (11, 5)


def test_4_2_unparseable_tool_arguments_give_an_empty_input():
    data = encoder().response(Completion("", "", (ToolCall("t", "f", '{"a": '),), "tool_calls", None, 1, 1))
    assert data["content"] == [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]


# ------------------------------------------------------------------------------------------------------ 5.x errors

@pytest.mark.parametrize("kind,status,etype,exc", [
    ("rate_limited", 429, "rate_limit_error", anthropic.RateLimitError),
    ("unavailable", 529, "overloaded_error", anthropic.APIStatusError),
    ("context_overflow", 400, "invalid_request_error", anthropic.BadRequestError),
    ("too_large", 413, "request_too_large", anthropic.APIStatusError),
    ("bad_request", 400, "invalid_request_error", anthropic.BadRequestError),
    ("not_found", 404, "not_found_error", anthropic.NotFoundError),
    ("websocket", 426, "invalid_request_error", anthropic.APIStatusError),
])
def test_5_1_error_response_table_through_the_sdk(kind, status, etype, exc):
    got_status, raw = codec.error_response(GatewayError(kind, "boom"))
    data = orjson.loads(raw)
    assert got_status == status and data["type"] == "error" and data["error"]["type"] == etype
    if kind == "context_overflow":
        assert data["error"]["message"] == "prompt is too long: boom"
    client = sdk(lambda r: httpx2.Response(status, content=raw, headers={"content-type": codec.JSON_CONTENT_TYPE}))
    with pytest.raises(exc) as info:
        client.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == status and info.value.body["error"]["type"] == etype


def test_5_2_backend_4xx_passes_on_and_5xx_is_overloaded():
    status, raw = codec.error_response(GatewayError("unavailable", "backend said no", status=400))
    assert status == 400 and orjson.loads(raw)["error"]["type"] == "invalid_request_error"
    status, raw = codec.error_response(GatewayError("unavailable", "backend answered 503", status=503))
    assert status == 529 and orjson.loads(raw)["error"]["type"] == "overloaded_error"


def test_5_3_mid_stream_error_event_raises_in_the_sdk():
    enc = encoder()
    payload = b"".join(enc.start() + enc.delta(Delta(text="par")) + enc.error(GatewayError("unavailable", "lost")))
    assert parse_events(payload)[-1] == ("error", {"type": "error",
                                                    "error": {"type": "overloaded_error", "message": "lost"}})
    client = sdk(sse_reply(payload))
    with pytest.raises(anthropic.APIStatusError) as info:
        with client.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as s:
            s.get_final_message()
    assert "lost" in str(info.value)


# ------------------------------------------------------------------------------------------- 6.x SDK round trips

def test_6_1_count_tokens_through_the_sdk():
    seen = {}

    def handler(request: httpx2.Request):
        r = codec.route(request.method, request.url.host, request.url.raw_path.decode(), request.headers)
        seen["plan"] = codec.to_chat(json.loads(request.content), r)
        return httpx2.Response(200, json=codec.count_tokens_response(17, r))

    n = sdk(handler).messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello"}],
                                           system="s")
    assert n.input_tokens == 17
    assert seen["plan"].chat["messages"] == [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]


def test_6_2_two_turn_tool_use_round_trips_reasoning_and_calls():
    captured: list = []
    replies: list = []  # SSE bytes for a streaming call, a Message dict for a JSON one

    def handler(request: httpx2.Request):
        captured.append(json.loads(request.content))
        reply = replies.pop(0)
        if isinstance(reply, dict):
            return httpx2.Response(200, json=reply)
        return httpx2.Response(200, content=reply, headers={"content-type": codec.STREAM_CONTENT_TYPE})

    client = sdk(handler)
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object",
                                                                      "properties": {"command": {"type": "string"}}}}]
    args = '{"command": "echo hi"}'
    replies.append(stream_bytes(encoder(), [
        Delta(reasoning="I should "), Delta(reasoning="run it."), Delta(text="Running."),
        Delta(tool_calls=(ToolCallDelta(0, id="chatcmpl-tool-1", name="Bash", arguments='{"command": '),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments='"echo hi"}'),))],
        Completion("Running.", "I should run it.", (ToolCall("chatcmpl-tool-1", "Bash", args),), "tool_calls", None,
                   20, 9)))
    history = [{"role": "user", "content": "say hi via bash"}]
    with client.messages.stream(model="m", max_tokens=99, tools=tools, messages=history,
                                thinking={"type": "enabled", "budget_tokens": 50}) as s:
        first = s.get_final_message()
    tool_use = first.content[-1]
    history += [{"role": "assistant", "content": first.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "hi"}]}]
    replies.append(encoder().response(Completion("Done.", "", (), "stop", None, 40, 2)))
    second = client.messages.create(model="m", max_tokens=99, tools=tools, messages=history)
    assert second.content[0].text == "Done."

    assert codec.to_chat(captured[0], GEN).stream is True
    plan = codec.to_chat(captured[1], GEN)
    assert plan.stream is False
    assert plan.chat["messages"][1:] == [
        {"role": "assistant", "content": "Running.", "reasoning_content": "I should run it.",
         "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function",
                         "function": {"name": "Bash", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "hi"}]
    assert "reasoning_dropped" not in plan.normalizations


# ----------------------------------------------------------------------------------------- 7.x real captures

def capture_files() -> list[str]:
    return sorted(glob.glob(os.path.join(CAPTURES, "*", "*.json")))


@pytest.mark.skipif(not capture_files(), reason="no ../shared/captures")
def test_7_1_every_anthropic_capture_translates():
    seen = 0
    for path in capture_files():
        with open(path) as f:
            cap = json.load(f)
        path_q = cap["path"] + ("?" + "&".join(f"{k}={v}" for k, v in cap["query"]) if cap.get("query") else "")
        r = codec.route(cap["method"], cap["host"], path_q, cap["headers"])
        if r is None or r.kind != "generate":
            continue
        seen += 1
        plan = codec.to_chat(cap["body"], r)
        assert plan.chat["messages"] and "removed_billing_header" in plan.normalizations
        assert not any(isinstance(m["content"], str) and m["content"].startswith(codec.BILLING_HEADER_PREFIX)
                       for m in plan.chat["messages"])
        assert codec.session_key(cap["headers"], cap["body"]).source == "harness:x-claude-code-session-id"
        for m in plan.chat["messages"]:
            for call in m.get("tool_calls", ()):
                json.loads(call["function"]["arguments"])
    assert seen >= 1
