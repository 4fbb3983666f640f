"""OpenAI Chat Completions codec: routing, session key, request validation, and the encoder checked by the official
`openai` SDK (its own types and stream accumulator) over an in-memory httpx transport — no sockets.

Scenarios: 1.x routing · 2.x session key · 3.x to_chat · 4.x captured CLI bodies · 5.x streaming encoder ·
6.x non-streaming response · 7.x errors.
"""

from __future__ import annotations

import json
import os

import httpx
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from polar.addon.codecs import openai_chat as codec
from polar.addon.codecs.base import (
    AgentInputError,
    ChatPlan,
    Completion,
    Delta,
    EncodeContext,
    GatewayError,
    Route,
    ToolCall,
    ToolCallDelta,
)

pytestmark = pytest.mark.unit

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CAPTURES = os.path.join(REPO, "..", "shared", "captures")
GEN = Route(protocol="openai_chat", kind="generate")
# Fields only the backend may see: an agent that did not ask must never receive any of them.
BACKEND_ONLY = (b"token_ids", b"prompt_token_ids", b"system_fingerprint", b"weight_versions", b"stop_reason",
                b'"logprobs":{')


def body(**kw):
    base = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    base.update(kw)
    return base


def plan_of(**kw) -> ChatPlan:
    return codec.to_chat(body(**kw), GEN)


# -- 1. routing ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "host", "path", "kind"),
    [
        ("POST", "api.openai.com", "/v1/chat/completions", "generate"),
        ("POST", "API.OpenAI.com:443", "/v1/chat/completions?x=1", "generate"),
        ("POST", "dashscope.aliyuncs.com", "/compatible-mode/v1/chat/completions", "generate"),
        ("POST", "dashscope-intl.aliyuncs.com", "/compatible-mode/v1/chat/completions", "generate"),
        ("GET", "api.openai.com", "/v1/chat/completions", "not_found"),
        ("GET", "api.openai.com", "/v1/models", "not_found"),
        ("POST", "dashscope.aliyuncs.com", "/api/v1/services/aigc/text-generation/generation", "not_found"),
        ("GET", "dashscope-intl.aliyuncs.com", "/compatible-mode/v1/models", "not_found"),
        ("POST", "dashscope.aliyuncs.com", "/v1/chat/completions", "not_found"),
    ],
)
def test_1_1_provider_hosts_route_generate_or_not_found(method, host, path, kind):
    r = codec.route(method, host, path, [])
    assert r is not None and r.protocol == "openai_chat" and r.kind == kind


@pytest.mark.parametrize(
    ("host", "path"),
    [
        ("api.openai.com", "/v1/responses"),
        ("api.openai.com", "/v1/responses/resp_1/cancel"),
        ("api.openai.com", "/v1/responses?stream=true"),
        ("api.anthropic.com", "/v1/chat/completions"),
        ("chatgpt.com", "/backend-api/codex/responses"),
        ("evil-api.openai.com", "/v1/chat/completions"),
        ("dashscope.aliyuncs.com.evil.com", "/compatible-mode/v1/chat/completions"),
    ],
)
def test_1_2_responses_paths_and_other_hosts_are_not_ours(host, path):
    assert codec.route("POST", host, path, []) is None


# -- 2. session key -----------------------------------------------------------------------------------------------


def test_2_1_qwen_metadata_session_id_is_the_harness_key():
    key = codec.session_key([], body(metadata={"sessionId": "c8aa", "promptId": "p"}))
    assert key is not None and (key.source, key.value) == ("harness:metadata.sessionId", "c8aa")


@pytest.mark.parametrize("b", [None, body(), body(metadata={"sessionId": ""}), body(metadata={"sessionId": 3}),
                               body(metadata="x")])
def test_2_2_no_session_key_is_invented(b):
    assert codec.session_key([], b) is None


# -- 3. to_chat ---------------------------------------------------------------------------------------------------


def test_3_1_plain_request_passes_through_and_records_the_agents_wishes():
    p = plan_of(temperature=0.2, top_p=0.9, seed=7, user="u1", frequency_penalty=0.5, presence_penalty=-0.5,
                stop="END", max_tokens=100, stream=True, stream_options={"include_usage": True})
    assert p.chat == {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.2, "top_p": 0.9,
                      "frequency_penalty": 0.5, "presence_penalty": -0.5, "seed": 7, "user": "u1",
                      "max_tokens": 100, "stop": ["END"]}
    assert p.stream is True and p.model_requested == "gpt-4o" and p.extra["include_usage"] is True
    assert p.normalizations == () and p.agent_top_logprobs is None and p.constrained is False


def test_3_2_streaming_without_include_usage_is_remembered():
    assert plan_of(stream=True).extra["include_usage"] is False
    assert plan_of(stream=True, stream_options={"include_usage": False}).extra["include_usage"] is False
    assert plan_of().stream is False


def test_3_3_developer_becomes_system_and_mid_conversation_system_stays_in_place():
    p = plan_of(messages=[{"role": "developer", "content": "rules"}, {"role": "user", "content": "a"},
                          {"role": "system", "content": [{"type": "text", "text": "late"}]},
                          {"role": "user", "content": "b"}])
    assert [m["role"] for m in p.chat["messages"]] == ["system", "user", "system", "user"]
    assert p.chat["messages"][2]["content"] == [{"type": "text", "text": "late"}]
    assert "developer_as_system" in p.normalizations


def test_3_4_text_and_image_parts_pass_and_cache_control_is_removed():
    parts = [{"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}]
    p = plan_of(messages=[{"role": "user", "content": parts}])
    assert p.chat["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}]
    assert p.normalizations == ("removed_cache_control",)
    assert parts[0]["cache_control"] == {"type": "ephemeral"}  # the agent's body is not mutated


def test_3_5_tools_tool_choice_and_parallel_tool_calls():
    tools = [{"type": "function", "function": {"name": "sh", "description": "run", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}}, "strict": True}},
             {"type": "function", "function": {"name": "ls"}}]
    p = plan_of(tools=tools, tool_choice="auto", parallel_tool_calls=False)
    assert p.chat["tools"] == tools and p.chat["tool_choice"] == "auto" and p.chat["parallel_tool_calls"] is False
    assert p.constrained is False
    assert plan_of(tools=tools, tool_choice="required").constrained is True
    named = plan_of(tools=tools, tool_choice={"type": "function", "function": {"name": "ls"}})
    assert named.constrained is True and named.chat["tool_choice"]["function"]["name"] == "ls"
    assert plan_of(tools=[], tool_choice="none").chat["tools"] == []  # the gateway drops empty lists


def test_3_6_assistant_tool_calls_keep_the_agents_argument_text_and_reasoning():
    args = '{"command": "echo hello",  "x":1}'
    msgs = [{"role": "user", "content": "run"},
            {"role": "assistant", "content": None, "reasoning_content": "I should run it",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "sh", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "hello"}]
    p = plan_of(messages=msgs)
    a = p.chat["messages"][1]
    assert a["tool_calls"][0]["function"]["arguments"] == args  # byte for byte, never re-serialized
    assert a["reasoning_content"] == "I should run it" and a["content"] is None
    assert p.chat["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "hello"}
    assert p.normalizations == ()


def test_3_7_tool_message_parts_are_flattened_and_parsed_arguments_serialized():
    msgs = [{"role": "user", "content": "run"},
            {"role": "assistant", "reasoning": "think",
             "tool_calls": [{"id": "c", "type": "function", "function": {"name": "sh", "arguments": {"a": 1}}}]},
            {"role": "tool", "tool_call_id": "c", "content": [
                {"type": "text", "text": "line1", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "line2"}]}]
    p = plan_of(messages=msgs)
    assert p.chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    assert p.chat["messages"][1]["reasoning_content"] == "think"
    assert p.chat["messages"][2]["content"] == "line1\nline2"
    assert set(p.normalizations) == {"tool_arguments_serialized", "reasoning_renamed", "removed_cache_control",
                                     "tool_content_flattened"}


def test_3_8_max_completion_tokens_becomes_max_tokens():
    p = plan_of(max_completion_tokens=64, max_tokens=1000)
    assert p.chat["max_tokens"] == 64 and "max_completion_tokens" not in p.chat
    assert "max_completion_tokens_as_max_tokens" in p.normalizations


def test_3_9_metadata_store_and_vendor_fields_are_dropped_and_noted():
    p = plan_of(metadata={"sessionId": "s"}, store=True, vl_high_resolution_images=True, service_tier="auto")
    assert set(p.chat) == {"messages"}
    assert set(p.normalizations) == {"dropped_metadata", "dropped_store", "dropped_field:vl_high_resolution_images",
                                     "dropped_service_tier"}


def test_3_10_response_format_json_schema_is_constrained():
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True}}
    p = plan_of(response_format=rf)
    assert p.chat["response_format"] == rf and p.constrained is True
    assert plan_of(response_format={"type": "json_object"}).constrained is False


def test_3_11_agent_logprobs_are_remembered_not_forwarded():
    p = plan_of(logprobs=True, top_logprobs=3)
    assert p.agent_top_logprobs == 3 and "logprobs" not in p.chat and "top_logprobs" not in p.chat
    assert plan_of(logprobs=True).agent_top_logprobs == 0
    assert plan_of(logprobs=False).agent_top_logprobs is None


@pytest.mark.parametrize(
    ("fields", "thinking", "note"),
    [
        ({"enable_thinking": False}, False, "thinking_control:enable_thinking"),
        ({"enable_thinking": True, "thinking_budget": 100}, True, "dropped_thinking_budget"),
        ({"reasoning_effort": "high"}, True, "thinking_control:reasoning_effort"),
        ({"reasoning_effort": "none"}, False, "thinking_control:reasoning_effort"),
        ({"chat_template_kwargs": {"enable_thinking": False, "x": 1}}, False, "dropped_chat_template_kwargs"),
        ({}, None, None),
    ],
)
def test_3_12_thinking_controls_become_the_plans_intent(fields, thinking, note):
    p = plan_of(**fields)
    assert p.extra["thinking"] is thinking and "chat_template_kwargs" not in p.chat
    assert note is None or note in p.normalizations


def test_3_13_n_one_is_accepted_and_sampling_extras_pass():
    p = plan_of(n=1, top_k=20, min_p=0.05, repetition_penalty=1.1, logit_bias={"50256": -100})
    assert "n" not in p.chat and p.chat["top_k"] == 20 and p.chat["min_p"] == 0.05
    assert p.chat["repetition_penalty"] == 1.1 and p.chat["logit_bias"] == {"50256": -100}


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "invalid role"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "deprecated"),
        ({"messages": [{"role": "user"}]}, "content"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"messages": [{"role": "user", "content": [{"type": "audio_url"}]}]}, "audio_url"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "text"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "image_url"),
        ({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
         "image_url"),
        ({"messages": [{"role": "assistant"}]}, "content' or 'tool_calls"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]},
         "'id'"),
        ({"messages": [{"role": "assistant", "tool_calls": "x"}]}, "tool_calls"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
        ({"messages": [{"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url",
                                                                          "image_url": {"url": "u"}}]}]},
         "image_url"),
        ({"tools": [{"type": "web_search"}]}, "web_search"),
        ({"tools": [{"type": "function", "function": {}}]}, "name"),
        ({"tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function",
                                                                      "function": {"name": "a"}}]}, "unique"),
        ({"tools": [{"type": "function", "function": {"name": "a"}}],
          "tool_choice": {"type": "function", "function": {"name": "b"}}}, "not in 'tools'"),
        ({"tool_choice": "required"}, "required"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"functions": [{"name": "f"}]}, "deprecated"),
        ({"n": 2}, "'n' > 1"),
        ({"n": 0}, "'n'"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 2}, "'logprobs' must be true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": "9"}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"seed": 1.5}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stream": "true"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "only allowed when 'stream'"),
        ({"stream": True, "stream_options": {"include_usage": "y"}}, "include_usage"),
        ({"response_format": {"type": "yaml"}}, "yaml"),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        ({"modalities": ["text", "audio"]}, "modality"),
        ({"model": 4}, "model"),
        ({"enable_thinking": "yes"}, "enable_thinking"),
    ],
)
def test_3_14_bad_input_is_a_clear_400(fields, needle):
    with pytest.raises(AgentInputError) as info:
        plan_of(**fields)
    assert info.value.kind == "bad_request" and needle in info.value.message
    status, raw = codec.error_response(info.value)
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_3_15_a_body_that_is_not_an_object_is_a_400():
    with pytest.raises(AgentInputError):
        codec.to_chat([1, 2], GEN)


# -- 4. captured CLI bodies ---------------------------------------------------------------------------------------


def _captures():
    if not os.path.isdir(CAPTURES):
        return []
    found = []
    for cli in sorted(os.listdir(CAPTURES)):
        folder = os.path.join(CAPTURES, cli)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            if name.endswith(".json"):
                found.append(os.path.join(folder, name))
    return found


def _ours(paths):
    out = []
    for path in paths:
        with open(path, "rb") as f:
            cap = orjson.loads(f.read())
        r = codec.route(cap["method"], cap["host"], cap["path"], cap["headers"])
        if r is not None and r.kind == "generate":
            out.append(pytest.param(cap, id=os.path.relpath(path, CAPTURES)))
    return out


def test_4_0_captures_include_qwen_code_when_present():
    if not os.path.isdir(CAPTURES):
        pytest.skip("../shared/captures is absent")
    assert len(_ours(_captures())) >= 3


@pytest.mark.parametrize("cap", _ours(_captures()) or [pytest.param(None, marks=pytest.mark.skip("no captures"))])
def test_4_1_every_captured_chat_body_translates(cap):
    b = cap["body"]
    p = codec.to_chat(b, GEN)
    assert len(p.chat["messages"]) == len(b["messages"])
    assert p.stream == b.get("stream", False) and p.model_requested == b["model"]
    assert p.extra["include_usage"] == bool((b.get("stream_options") or {}).get("include_usage"))
    assert "metadata" not in p.chat and "dropped_metadata" in p.normalizations
    assert p.chat.get("max_tokens") == b.get("max_tokens")
    for sent, kept in zip(b["messages"], p.chat["messages"]):
        assert kept["role"] == sent["role"]
        for tc_sent, tc_kept in zip(sent.get("tool_calls") or [], kept.get("tool_calls") or []):
            assert tc_kept["function"]["arguments"] == tc_sent["function"]["arguments"]
    assert b"cache_control" not in orjson.dumps(p.chat)
    key = codec.session_key(cap["headers"], b)
    assert key is not None and key.value == b["metadata"]["sessionId"]


# -- 5. streaming encoder, read by the openai SDK ------------------------------------------------------------------


def encoder(plan: ChatPlan | None = None, **ctx) -> codec.Encoder:
    plan = plan or plan_of(stream=True, stream_options={"include_usage": True})
    return codec.Encoder(EncodeContext(plan=plan, route=GEN, response_id=ctx.get("rid", "rec123"),
                                       model=ctx.get("model", "gpt-4o"), prompt_tokens=11, created=1700000000))


def client_for(status: int, content: bytes, content_type: str) -> openai.OpenAI:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type}, content=content)

    return openai.OpenAI(api_key="k", base_url="https://api.openai.com/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def stream_bytes(enc: codec.Encoder, deltas, completion: Completion) -> bytes:
    out = enc.start()
    for d in deltas:
        out += enc.delta(d)
    out += enc.finish(completion)
    return b"".join(out)


def sdk_stream(raw: bytes, **kw):
    client = client_for(200, raw, codec.STREAM_CONTENT_TYPE)
    return list(client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                               stream=True, **kw))


def sdk_final(raw: bytes, **kw):
    client = client_for(200, raw, codec.STREAM_CONTENT_TYPE)
    with client.chat.completions.stream(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], **kw) as s:
        return s.get_final_completion()


def events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"\n\n")
    return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]


def completion(content="", reasoning="", calls=(), finish="stop", prompt=11, gen=5, logprobs=()) -> Completion:
    return Completion(content=content, reasoning=reasoning, tool_calls=tuple(calls), finish_reason=finish,
                      stop_reason=None, prompt_tokens=prompt, completion_tokens=gen, logprobs=tuple(logprobs))


def test_5_1_text_stream_role_chunk_deltas_finish_usage_done():
    raw = stream_bytes(encoder(), [Delta(text="Hel"), Delta(text="lo"), Delta(finish_reason="stop")],
                       completion("Hello"))
    ev = events(raw)
    assert ev[-1] == b"[DONE]"
    first = json.loads(ev[0])
    assert first["object"] == "chat.completion.chunk" and first["id"] == "chatcmpl-rec123"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = sdk_stream(raw, stream_options={"include_usage": True})
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 11
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.total_tokens == 16
    assert all(c.model == "gpt-4o" and c.created == 1700000000 for c in chunks)


def test_5_2_no_usage_chunk_unless_the_agent_asked():
    raw = stream_bytes(encoder(plan_of(stream=True)), [Delta(text="x")], completion("x"))
    assert b"usage" not in raw and events(raw)[-1] == b"[DONE]"
    assert all(c.choices for c in sdk_stream(raw))


def test_5_3_backend_only_fields_never_leak():
    lp = ({"token": "x", "logprob": -0.1, "bytes": [120], "top_logprobs": [], "token_id": 87},)
    raw = stream_bytes(encoder(), [Delta(text="x", logprobs=lp), Delta(logprobs=lp, finish_reason="length")],
                       completion("x", finish="length", logprobs=lp))
    for needle in BACKEND_ONLY:
        assert needle not in raw
    assert len(events(raw)) == 5  # role, text, finish, usage, [DONE]: a logprobs-only delta emits nothing
    body = orjson.dumps(encoder().response(completion("x", logprobs=lp)))
    for needle in BACKEND_ONLY:
        assert needle not in body


def test_5_4_agent_logprobs_are_honoured_and_cut_to_its_top_k():
    top = [{"token": t, "logprob": -i, "bytes": None} for i, t in enumerate("abcde")]
    lp = tuple({"token": t, "logprob": -0.5, "bytes": [ord(t)], "top_logprobs": top, "token_id": 1} for t in "hi")
    plan = plan_of(stream=True, logprobs=True, top_logprobs=2)
    raw = stream_bytes(encoder(plan), [Delta(text="h", logprobs=lp[:1]), Delta(text="i", logprobs=lp[1:])],
                       completion("hi", logprobs=lp))
    assert b"token_id" not in raw
    chunks = sdk_stream(raw, logprobs=True, top_logprobs=2)
    got = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in got] == ["h", "i"] and all(len(e.top_logprobs) == 2 for e in got)
    final = sdk_final(raw, logprobs=True, top_logprobs=2)
    assert [e.token for e in final.choices[0].logprobs.content] == ["h", "i"]


def test_5_5_mid_stream_error_is_an_error_event_without_done():
    enc = encoder()
    raw = b"".join(enc.start() + enc.delta(Delta(text="partial")) + enc.error(GatewayError("unavailable", "lost")))
    assert b"[DONE]" not in raw
    assert json.loads(events(raw)[-1])["error"]["message"] == "lost"
    with pytest.raises(openai.APIError, match="lost"):
        sdk_stream(raw)


def test_5_6_tool_call_first_piece_has_id_type_name_then_argument_fragments():
    enc = encoder()
    raw = stream_bytes(enc, [Delta(tool_calls=(ToolCallDelta(0, "chatcmpl-tool-1", "sh", ""),)),
                             Delta(tool_calls=(ToolCallDelta(0, arguments='{"a"'),)),
                             Delta(tool_calls=(ToolCallDelta(0, arguments=": 1}"),), finish_reason="tool_calls")],
                       completion(calls=[ToolCall("chatcmpl-tool-1", "sh", '{"a": 1}')], finish="tool_calls"))
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events(raw)[1:4]]
    assert deltas[0]["tool_calls"] == [{"index": 0, "id": "chatcmpl-tool-1", "type": "function",
                                        "function": {"name": "sh", "arguments": ""}}]
    assert deltas[1]["tool_calls"] == [{"index": 0, "function": {"arguments": '{"a"'}}]
    final = sdk_final(raw)
    call = final.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("chatcmpl-tool-1", "sh", '{"a": 1}')
    assert final.choices[0].finish_reason == "tool_calls"


def _split(draw, text: str) -> list[str]:
    if not text:
        return []
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=6)))
    cuts = [c for c in cuts if 0 < c < len(text)]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
args_json = st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=8)),
                            max_size=3).map(lambda d: json.dumps(d))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reasoning=texts, content=texts,
       calls=st.lists(st.tuples(st.sampled_from(["sh", "read_file", "glob"]), args_json), max_size=3),
       interleave=st.booleans(), usage=st.booleans(), data=st.data())
def test_5_7_any_rechunking_accumulates_to_the_same_message(reasoning, content, calls, interleave, usage, data):
    """Reasoning → text → (parallel) tool calls, every fragment split at random points, several fragments
    sometimes in one backend chunk, parallel calls optionally interleaved: the SDK's accumulator rebuilds it."""
    pieces: list[Delta] = [Delta(reasoning=p) for p in _split(data.draw, reasoning)]
    pieces += [Delta(text=p) for p in _split(data.draw, content)]
    call_pieces = []
    for i, (name, args) in enumerate(calls):
        frags = _split(data.draw, args) or [""]
        call_pieces.append([ToolCallDelta(i, f"call-{i}", name, frags[0])]
                           + [ToolCallDelta(i, arguments=f) for f in frags[1:]])
    if interleave:  # round-robin over parallel calls, as a parser streaming them side by side would
        while any(call_pieces):
            for q in call_pieces:
                if q:
                    pieces.append(Delta(tool_calls=(q.pop(0),)))
    else:
        pieces += [Delta(tool_calls=(t,)) for q in call_pieces for t in q]
    # Merge random neighbours into one backend chunk (a chunk may hold reasoning, text and tool pieces).
    merged: list[Delta] = []
    for d in pieces:
        if merged and data.draw(st.booleans()) and not (
                set(t.index for t in d.tool_calls) & set(t.index for t in merged[-1].tool_calls)):
            m = merged[-1]
            merged[-1] = Delta(text=m.text + d.text, reasoning=m.reasoning + d.reasoning,
                               tool_calls=m.tool_calls + d.tool_calls)
        else:
            merged.append(d)
    finish = "tool_calls" if calls else "stop"
    done = completion(content, reasoning, [ToolCall(f"call-{i}", n, a) for i, (n, a) in enumerate(calls)], finish,
                      gen=len(pieces) + 1)
    kw = {"stream_options": {"include_usage": True}} if usage else {}
    plan = plan_of(stream=True, **kw)
    raw = stream_bytes(encoder(plan), merged, done)
    for ev in events(raw)[:-1]:
        ChatCompletionChunk.model_validate_json(ev)  # strict pydantic validation, not the SDK's lenient construct
    final = sdk_final(raw, **kw)
    msg = final.choices[0].message
    assert (msg.content or "") == content
    assert (getattr(msg, "reasoning_content", None) or "") == reasoning
    got = [(t.id, t.function.name, t.function.arguments) for t in msg.tool_calls or []]
    assert got == [(f"call-{i}", n, a) for i, (n, a) in enumerate(calls)]
    assert final.choices[0].finish_reason == finish
    assert (final.usage is not None) == usage
    if usage:
        assert final.usage.completion_tokens == len(pieces) + 1


# -- 6. non-streaming response ------------------------------------------------------------------------------------


def sdk_json(resp: dict, **kw) -> ChatCompletion:
    client = client_for(200, orjson.dumps(resp), codec.JSON_CONTENT_TYPE)
    return client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], **kw)


def test_6_1_text_response_is_a_valid_chat_completion():
    resp = encoder(plan_of()).response(completion("Hello", reasoning="hmm", finish="length", gen=3))
    cc = ChatCompletion.model_validate(resp)
    assert cc.id == "chatcmpl-rec123" and cc.object == "chat.completion"
    assert cc.choices[0].message.content == "Hello" and cc.choices[0].finish_reason == "length"
    assert resp["choices"][0]["message"]["reasoning_content"] == "hmm"
    assert cc.usage.prompt_tokens == 11 and cc.usage.completion_tokens == 3 and cc.usage.total_tokens == 14
    assert cc.choices[0].logprobs is None
    assert sdk_json(resp).choices[0].message.content == "Hello"


def test_6_2_tool_call_response_has_null_content_and_the_backends_ids():
    resp = encoder(plan_of()).response(completion(calls=[ToolCall("call_a", "sh", '{"c":"ls"}'),
                                                         ToolCall("call_b", "glob", "{}")], finish="tool_calls"))
    cc = ChatCompletion.model_validate(resp)
    m = cc.choices[0].message
    assert m.content is None and cc.choices[0].finish_reason == "tool_calls"
    assert [(t.id, t.function.name, t.function.arguments) for t in m.tool_calls] == [
        ("call_a", "sh", '{"c":"ls"}'), ("call_b", "glob", "{}")]
    assert "reasoning_content" not in resp["choices"][0]["message"]


def test_6_3_logprobs_in_the_response_only_when_asked():
    lp = ({"token": "x", "logprob": -0.2, "bytes": [120], "top_logprobs": [{"token": "x", "logprob": -0.2,
                                                                            "bytes": [120]}]},)
    asked = encoder(plan_of(logprobs=True, top_logprobs=1)).response(completion("x", logprobs=lp))
    cc = sdk_json(asked, logprobs=True, top_logprobs=1)
    assert cc.choices[0].logprobs.content[0].logprob == -0.2
    assert cc.choices[0].logprobs.content[0].top_logprobs[0].token == "x"
    assert encoder(plan_of()).response(completion("x", logprobs=lp))["choices"][0]["logprobs"] is None


def test_6_4_provider_stop_reason_is_vllms_value():
    assert codec.provider_stop_reason(completion(finish="length")) == "length"
    assert codec.provider_stop_reason(completion(finish=None)) == "stop"
    calls = [ToolCall("c", "sh", "{}")]
    assert codec.provider_stop_reason(completion(calls=calls, finish="tool_calls")) == "tool_calls"


def test_6_5_tool_calls_finish_without_a_parsed_call_is_told_as_stop():
    """vLLM can stream a forced call as plain content yet finish `tool_calls`; the agent must not hunt for calls."""
    raw_call = '[{"name": "sh", "parameters": {}}]'
    c = completion(raw_call, finish="tool_calls")
    assert codec.provider_stop_reason(c) == "stop"
    assert encoder(plan_of()).response(c)["choices"][0]["finish_reason"] == "stop"
    raw = stream_bytes(encoder(), [Delta(text=raw_call, finish_reason="tool_calls")], c)
    assert sdk_final(raw).choices[0].finish_reason == "stop"


# -- 7. errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "code", "sdk_error"),
    [
        ("rate_limited", 429, "rate_limit_exceeded", openai.RateLimitError),
        ("unavailable", 503, "service_unavailable", openai.InternalServerError),
        ("context_overflow", 400, "context_length_exceeded", openai.BadRequestError),
        ("too_large", 413, "request_too_large", openai.APIStatusError),
        ("bad_request", 400, None, openai.BadRequestError),
        ("not_found", 404, "not_found", openai.NotFoundError),
        ("websocket", 426, "upgrade_required", openai.APIStatusError),
    ],
)
def test_7_1_errors_before_headers_follow_the_design_table(kind, status, code, sdk_error):
    got_status, raw = codec.error_response(GatewayError(kind, f"{kind} happened"))
    assert got_status == status
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code
    client = client_for(status, raw, codec.JSON_CONTENT_TYPE)
    with pytest.raises(sdk_error) as info:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == status and info.value.code == code
    assert f"{kind} happened" in str(info.value)


def test_7_2_a_status_override_is_kept():
    status, raw = codec.error_response(GatewayError("bad_request", "backend said no", status=422))
    assert status == 422 and json.loads(raw)["error"]["message"] == "backend said no"
