"""Google GenerateContent codec: routing, session key, request translation, and the encoder checked by the official
`google-genai` SDK (its own types and stream parser) over an in-memory httpx transport — no sockets.

Scenarios: 1.x routing · 2.x session key · 3.x to_chat · 4.x schemas, tools, generation config · 5.x captured CLI
bodies · 6.x streaming encoder (SSE) · 7.x JSON array stream · 8.x non-streaming response · 9.x round trip through
the SDK · 10.x errors.
"""

from __future__ import annotations

import base64
import glob
import json
import os

import httpx
import orjson
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.addon.codecs import google as codec
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

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CAPTURES = os.path.join(REPO, "..", "shared", "captures")
HOST = "generativelanguage.googleapis.com"
GEN = Route("google_generate", "generate", stream=False, model="gemini-x")
SSE = Route("google_generate", "generate", stream=True, model="gemini-x", sse=True)
ARRAY = Route("google_generate", "generate", stream=True, model="gemini-x", sse=False)
COUNT = Route("google_generate", "count_tokens", stream=False, model="gemini-x")


def body(*contents, **kw):
    base = {"contents": list(contents) or [user("hi")]}
    base.update(kw)
    return base


def user(*texts):
    return {"role": "user", "parts": [{"text": t} for t in texts]}


def chat(b, r=GEN):
    return codec.to_chat(b, r)


def sdk_client(handler) -> genai.Client:
    """A real google-genai client whose HTTP goes to `handler` in memory."""
    http = httpx.Client(transport=httpx.MockTransport(handler))
    return genai.Client(api_key="x", http_options=types.HttpOptions(httpx_client=http))


def completion(content="", reasoning="", calls=(), finish=None, prompt=11, completion_tokens=7):
    finish = finish or ("tool_calls" if calls else "stop")
    return Completion(content=content, reasoning=reasoning, tool_calls=tuple(calls), finish_reason=finish,
                      stop_reason=None, prompt_tokens=prompt, completion_tokens=completion_tokens)


def encoder(route, include_thoughts=True, request=None):
    plan = chat(request or body(generationConfig={"thinkingConfig": {"includeThoughts": include_thoughts}}), route)
    return codec.Encoder(EncodeContext(plan, route, "resp-1", model="gemini-x", prompt_tokens=11, created=1))


def stream_bytes(route, deltas, comp, include_thoughts=True) -> bytes:
    enc = encoder(route, include_thoughts)
    out = enc.start()
    for d in deltas:
        out += enc.delta(d)
    out += enc.finish(comp)
    return b"".join(out)


# -- 1. routing ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "kind", "stream", "sse", "model"),
    [
        ("POST", "/v1beta/models/gemini-2.5-pro:generateContent", "generate", False, True, "gemini-2.5-pro"),
        ("POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "generate", True, True,
         "gemini-2.5-pro"),
        ("POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "generate", True, False, "gemini-2.5-pro"),
        ("POST", "/v1beta/models/m:streamGenerateContent?key=abc&alt=sse", "generate", True, True, "m"),
        ("POST", "/v1/models/gemini-3.8-flash:generateContent", "generate", False, True, "gemini-3.8-flash"),
        ("POST", "/v1alpha/models/m:countTokens", "count_tokens", False, True, "m"),
        ("POST", "/v1beta/models/gemini%2Dx:generateContent", "generate", False, True, "gemini-x"),
    ],
)
def test_1_1_generation_and_count_paths(method, path, kind, stream, sse, model):
    r = codec.route(method, HOST, path, [])
    assert (r.protocol, r.kind, r.stream, r.sse, r.model) == ("google_generate", kind, stream, sse, model)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1beta/models"),
        ("GET", "/v1beta/models/gemini-2.5-pro"),
        ("GET", "/v1beta/models/gemini-2.5-pro:generateContent"),
        ("POST", "/v1beta/models/m:embedContent"),
        ("POST", "/v1beta/cachedContents"),
        ("POST", "/upload/v1beta/files"),
        ("POST", "/v2/models/m:generateContent"),
    ],
)
def test_1_2_other_paths_on_the_host_are_not_found(method, path):
    assert codec.route(method, HOST, path, []).kind == "not_found"


def test_1_3_other_hosts_are_not_ours_and_a_port_is_ignored():
    assert codec.route("POST", "api.openai.com", "/v1beta/models/m:generateContent", []) is None
    assert codec.route("POST", f"{HOST}:443", "/v1beta/models/m:generateContent", []).kind == "generate"


def test_1_4_stream_content_type_follows_alt_sse():
    assert codec.stream_content_type(SSE) == "text/event-stream"
    assert codec.stream_content_type(ARRAY).startswith("application/json")


# -- 2. session key -----------------------------------------------------------------------------------------------


def test_2_1_no_session_key_even_with_the_installation_id_header():
    headers = [("x-gemini-api-privileged-user-id", "1eb4c90b-7b75-4c4e-aed5-5660ad50b4e8")]
    assert codec.session_key(headers, body()) is None


# -- 3. to_chat: contents -----------------------------------------------------------------------------------------


def test_3_1_system_instruction_and_text_parts():
    p = chat(body(user("a", "b"), systemInstruction={"role": "user", "parts": [{"text": "S1"}, {"text": "S2"}]}))
    assert p.chat["messages"] == [
        {"role": "system", "content": "S1\nS2"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    assert p.model_requested == "gemini-x" and p.stream is False and p.normalizations == ()


def test_3_2_inline_image_becomes_a_data_url_and_inline_text_is_decoded():
    img = base64.b64encode(b"\x89PNG").decode()
    txt = base64.b64encode("notes ü".encode()).decode()
    p = chat(body({"role": "user", "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": img}},
                                             {"inlineData": {"mimeType": "text/plain", "data": txt}}]}))
    content = p.chat["messages"][0]["content"]
    assert content[1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{img}"}}
    assert content[2] == {"type": "text", "text": "notes ü"}
    assert "inline_text_decoded" in p.normalizations


def test_3_3_file_data_images_pass_as_urls_noted_and_unsupported_media_is_a_400():
    p = chat(body({"role": "user", "parts": [{"fileData": {"mimeType": "image/jpeg", "fileUri": "https://x/y.jpg"}}]}))
    assert p.chat["messages"][0]["content"] == [{"type": "image_url", "image_url": {"url": "https://x/y.jpg"}}]
    assert "file_data_passed_as_url" in p.normalizations
    with pytest.raises(AgentInputError, match="application/pdf"):
        chat(body({"role": "user", "parts": [{"inlineData": {"mimeType": "application/pdf", "data": "AAAA"}}]}))


def test_3_4_function_calls_and_responses_match_by_id_then_by_name():
    b = body(
        user("go"),
        {"role": "model", "parts": [{"functionCall": {"id": "c-1", "name": "ls", "args": {"p": "."}}},
                                    {"functionCall": {"name": "cat", "args": {"f": "a"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "cat", "response": {"output": "A"}}},
                                   {"functionResponse": {"id": "c-1", "name": "ls", "response": {"output": "x"}}}]},
    )
    msgs = chat(b).chat["messages"]
    assert msgs[1]["tool_calls"] == [
        {"id": "c-1", "type": "function", "function": {"name": "ls", "arguments": '{"p": "."}'}},
        {"id": "call_1_1", "type": "function", "function": {"name": "cat", "arguments": '{"f": "a"}'}},
    ]
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_1_1", "content": '{"output": "A"}'}
    assert msgs[3] == {"role": "tool", "tool_call_id": "c-1", "content": '{"output": "x"}'}
    # Derived ids are a function of position only: the same history gives the same ids every turn.
    assert chat(b).chat["messages"] == msgs
    # We sign every function-call turn we answer; an unsigned one lost its reasoning and exact arguments.
    assert chat(b).normalizations == ("reasoning_dropped",)


def test_3_5_unanswered_or_orphan_function_parts_are_400s():
    call = {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}}]}
    with pytest.raises(AgentInputError, match="answers no functionCall"):
        chat(body(user("x"), {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {}}}]}))
    for history in ([user("x"), call, call], [user("x"), call, user("y")], [user("x"), call]):
        with pytest.raises(AgentInputError, match="has no functionResponse"):
            chat(body(*history))
    # Answers split over consecutive turns are fine (each becomes a tool message in order).
    two = {"role": "model", "parts": [{"functionCall": {"name": "a", "args": {}}},
                                      {"functionCall": {"name": "b", "args": {}}}]}
    answers = [{"role": "user", "parts": [{"functionResponse": {"name": n, "response": {}}}]} for n in "ab"]
    assert [m["role"] for m in chat(body(user("x"), two, *answers)).chat["messages"]] == [
        "user", "assistant", "tool", "tool"]


def test_3_6_text_after_tool_results_follows_them_noted():
    b = body(user("x"), {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}}]},
             {"role": "user", "parts": [{"text": "also"}, {"functionResponse": {"name": "ls", "response": {}}}]})
    p = chat(b)
    assert [m["role"] for m in p.chat["messages"]] == ["user", "assistant", "tool", "user"]
    assert "user_parts_moved_after_tool_results" in p.normalizations


def test_3_7_thought_parts_become_reasoning_content():
    thoughts = [{"text": "hmm ", "thought": True}, {"text": "think", "thought": True}]
    b = body(user("x"), {"role": "model", "parts": [*thoughts, {"text": "answer"}]}, user("y"))
    assert chat(b).chat["messages"][1] == {"role": "assistant", "content": "answer", "reasoning_content": "hmm think"}


def test_3_8_our_signature_restores_reasoning_and_exact_argument_text():
    raw = '{"command":"ls  -la", "n": 1.50}'  # not what json.dumps would write
    sig = codec.encode_signature("I should list.", [raw])
    b = body(user("x"), {"role": "model", "parts": [
        {"functionCall": {"id": "c", "name": "sh", "args": {"command": "ls  -la", "n": 1.5}},
         "thoughtSignature": sig}]},
        {"role": "user", "parts": [{"functionResponse": {"id": "c", "name": "sh", "response": {"o": 1}}}]})
    p = chat(b)
    a = p.chat["messages"][1]
    assert a["reasoning_content"] == "I should list."
    assert a["tool_calls"][0]["function"]["arguments"] == raw
    assert p.normalizations == ()
    # URL-safe base64 without padding (how some SDKs re-serialize bytes) decodes the same.
    urlsafe = base64.urlsafe_b64encode(base64.b64decode(sig)).decode().rstrip("=")
    assert codec.decode_signature(urlsafe) == codec.decode_signature(sig)


def test_3_9_edited_arguments_win_over_the_signature():
    sig = codec.encode_signature("", ['{"a": 1}'])
    b = body(user("x"), {"role": "model", "parts": [
        {"functionCall": {"name": "f", "args": {"a": 2}}, "thoughtSignature": sig}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]})
    assert chat(b).chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a": 2}'


def test_3_10_placeholder_and_foreign_signatures_are_ignored_and_noted():
    b = body(user("x"), {"role": "model", "parts": [
        {"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "skip_thought_signature_validator"},
        {"text": "t", "thoughtSignature": "CikBcsjafFK168Ibt"}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]})
    p = chat(b)
    assert "reasoning_content" not in p.chat["messages"][1]
    assert {"thought_signature_placeholder_ignored", "foreign_thought_signature_ignored",
            "reasoning_dropped"} <= set(p.normalizations)


def test_3_11_raw_invalid_arguments_we_sent_come_back_as_text():
    b = body(user("x"), {"role": "model", "parts": [{"functionCall": {"name": "f",
                                                                      "args": {"__raw_arguments__": "{oops"}}}]},
             {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]})
    assert chat(b).chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == "{oops"


@pytest.mark.parametrize(
    ("b", "match"),
    [
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "role"),
        ({"contents": [{"role": "user"}]}, "parts"),
        ({"contents": [{"role": "user", "parts": ["x"]}]}, "parts"),
        ({"contents": [{"role": "user", "parts": [{"functionCall": {"name": "f"}}]}]}, "model"),
        ({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "cachedContent": "c/1"}, "cachedContent"),
        ({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "systemInstruction": 5}, "systemInstruction"),
    ],
)
def test_3_12_bad_bodies_are_agent_input_errors(b, match):
    with pytest.raises(AgentInputError, match=match):
        chat(b)


def test_3_13_unknown_parts_are_dropped_and_noted():
    b = body(user("x"), {"role": "model", "parts": [{"executableCode": {"code": "1"}}, {"text": "ok"}]}, user("y"))
    p = chat(b)
    assert p.chat["messages"][1]["content"] == "ok"
    assert "dropped_part:executableCode" in p.normalizations


def test_3_14_count_tokens_accepts_a_wrapped_generate_request():
    inner = body(user("x"), systemInstruction={"parts": [{"text": "S"}]})
    p = chat({"generateContentRequest": {"model": "models/gemini-x", **inner}}, COUNT)
    assert [m["role"] for m in p.chat["messages"]] == ["system", "user"]
    assert codec.count_tokens_response(42, COUNT) == {"totalTokens": 42}


def test_3_15_snake_case_field_names_are_accepted_like_googles_proto_json_parser():
    # google-genai for Python sends snake_case inside thinkingConfig and schemas; property names stay as sent.
    b = {"contents": [{"role": "user", "parts": [{"text": "x"}]}],
         "system_instruction": {"parts": [{"text": "S"}]},
         "tools": [{"function_declarations": [{"name": "f", "parameters": {
             "type": "OBJECT", "properties": {"my_arg": {"type": "STRING", "max_length": "3"}}}}]}],
         "tool_config": {"function_calling_config": {"mode": "ANY", "allowed_function_names": ["f"]}},
         "generation_config": {"max_output_tokens": 5, "stop_sequences": ["z"],
                               "thinking_config": {"include_thoughts": True, "thinking_budget": 0}}}
    p = chat(b)
    assert p.chat["messages"][0] == {"role": "system", "content": "S"}
    assert p.chat["tools"][0]["function"]["parameters"]["properties"] == {
        "my_arg": {"type": "string", "maxLength": 3}}
    assert p.chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert (p.chat["max_tokens"], p.chat["stop"]) == (5, ["z"])
    assert p.extra == {"thinking": False, "include_thoughts": True}
    args = {"snake_key": {"inner_key": 1}}
    b = body(user("x"), {"role": "model", "parts": [{"function_call": {"name": "f", "args": args}}]},
             {"role": "user", "parts": [{"function_response": {"name": "f", "response": {"out_put": 1}}}]})
    msgs = chat(b).chat["messages"]
    assert json.loads(msgs[1]["tool_calls"][0]["function"]["arguments"]) == args
    assert msgs[2]["content"] == '{"out_put": 1}'


# -- 4. schemas, tools, generation config -------------------------------------------------------------------------


OPENAPI = {"type": "OBJECT", "propertyOrdering": ["a", "type"],
           "properties": {"a": {"type": "STRING", "nullable": True, "enum": ["x", "y"]},
                          "type": {"type": "ARRAY", "items": {"type": "INTEGER"}, "minItems": "1"}},
           "required": ["a"]}


def test_4_1_openapi_parameters_are_lowercased_json_schema_noted():
    p = chat(body(tools=[{"functionDeclarations": [{"name": "f", "description": "d", "parameters": OPENAPI}]}]))
    assert p.chat["tools"] == [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"a": {"type": ["string", "null"], "enum": ["x", "y"]},
                                         "type": {"type": "array", "items": {"type": "integer"}, "minItems": 1}},
        "required": ["a"]}}}]
    assert {"schema_types_lowercased", "schema_nullable_converted", "schema_property_ordering_dropped"} <= set(
        p.normalizations)


def test_4_2_parameters_json_schema_passes_as_is_and_no_parameters_is_an_empty_object():
    js = {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "$defs": {"X": {"type": "string"}}}
    p = chat(body(tools=[{"functionDeclarations": [{"name": "f", "parametersJsonSchema": js}, {"name": "g"}]}]))
    assert p.chat["tools"][0]["function"]["parameters"] == js
    assert p.chat["tools"][1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert p.normalizations == ()


def test_4_3_server_tools_are_dropped_and_noted():
    p = chat(body(tools=[{"googleSearch": {}}, {"codeExecution": {}},
                         {"functionDeclarations": [{"name": "f", "parametersJsonSchema": {"type": "object"}}]}]))
    assert [t["function"]["name"] for t in p.chat["tools"]] == ["f"]
    assert {"dropped_server_tool:googleSearch", "dropped_server_tool:codeExecution"} <= set(p.normalizations)


TOOLS = [{"functionDeclarations": [{"name": n, "parametersJsonSchema": {"type": "object"}} for n in ("a", "b", "c")]}]


@pytest.mark.parametrize(
    ("cfg", "choice", "constrained", "note"),
    [
        ({"mode": "AUTO"}, "auto", False, None),
        ({"mode": "NONE"}, "none", False, None),
        ({"mode": "ANY"}, "required", True, None),
        ({"mode": "ANY", "allowedFunctionNames": ["b"]}, {"type": "function", "function": {"name": "b"}}, True, None),
        ({"mode": "ANY", "allowedFunctionNames": ["a", "b"]}, "required", True, "allowed_function_names_widened"),
        ({"mode": "VALIDATED"}, "auto", False, "tool_mode_validated_as_auto"),
    ],
)
def test_4_4_function_calling_modes_map_to_tool_choice(cfg, choice, constrained, note):
    p = chat(body(tools=TOOLS, toolConfig={"functionCallingConfig": cfg}))
    assert p.chat["tool_choice"] == choice and p.constrained is constrained
    assert (note in p.normalizations) if note else p.normalizations == ()


def test_4_5_unknown_mode_or_undeclared_allowed_name_is_a_400():
    with pytest.raises(AgentInputError, match="mode"):
        chat(body(tools=TOOLS, toolConfig={"functionCallingConfig": {"mode": "SOMETIMES"}}))
    with pytest.raises(AgentInputError, match="zz"):
        chat(body(tools=TOOLS, toolConfig={"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["zz"]}}))


def test_4_6_generation_config_maps_sampling_limits_and_stops():
    p = chat(body(generationConfig={"temperature": 0.2, "topP": 0.9, "topK": 40, "maxOutputTokens": 99,
                                    "stopSequences": ["END"], "seed": 3, "candidateCount": 1}))
    assert {k: v for k, v in p.chat.items() if k != "messages"} == {
        "temperature": 0.2, "top_p": 0.9, "top_k": 40, "max_tokens": 99, "stop": ["END"], "seed": 3}
    with pytest.raises(AgentInputError, match="candidateCount"):
        chat(body(generationConfig={"candidateCount": 2}))


def test_4_7_router_style_json_schema_output_is_constrained_and_lowercased():
    schema = {"type": "OBJECT", "properties": {"reasoning": {"type": "STRING"},
                                               "model_choice": {"type": "STRING", "enum": ["flash", "pro"]}},
              "required": ["reasoning", "model_choice"]}
    for key in ("responseJsonSchema", "responseSchema"):
        p = chat(body(generationConfig={"responseMimeType": "application/json", key: schema}))
        rf = p.chat["response_format"]
        assert rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True
        assert rf["json_schema"]["schema"]["properties"]["model_choice"] == {"type": "string", "enum": ["flash", "pro"]}
        assert p.constrained and "schema_types_lowercased" in p.normalizations


def test_4_8_json_mime_without_schema_is_json_object_unconstrained():
    p = chat(body(generationConfig={"responseMimeType": "application/json"}))
    assert p.chat["response_format"] == {"type": "json_object"} and not p.constrained


@pytest.mark.parametrize(
    ("tc", "thinking", "include"),
    [
        (None, None, False),
        ({"includeThoughts": True}, True, True),
        ({"thinkingBudget": 0}, False, False),
        ({"thinkingBudget": -1, "includeThoughts": False}, True, False),
        ({"thinkingBudget": 1024, "includeThoughts": True}, True, True),
        ({"thinkingLevel": "HIGH", "includeThoughts": True}, True, True),
        ({"thinkingLevel": "MINIMAL"}, False, False),
    ],
)
def test_4_9_thinking_config_becomes_the_thinking_intent(tc, thinking, include):
    gc = {"thinkingConfig": tc} if tc is not None else {}
    p = chat(body(generationConfig=gc))
    assert p.extra == {"thinking": thinking, "include_thoughts": include}
    assert "chat_template_kwargs" not in p.chat


# -- 5. captured CLI bodies ---------------------------------------------------------------------------------------


def _captures():
    return sorted(p for p in glob.glob(os.path.join(CAPTURES, "*", "*.json"))
                  if json.load(open(p)).get("host", "").split(":")[0] == HOST)


@pytest.mark.skipif(not os.path.isdir(CAPTURES), reason="no ../shared/captures")
@pytest.mark.parametrize("path", _captures() if os.path.isdir(CAPTURES) else [], ids=os.path.basename)
def test_5_1_every_captured_google_body_translates(path):
    cap = json.load(open(path))
    query = "&".join(f"{k}={v}" for k, v in cap.get("query") or [])
    r = codec.route(cap["method"], cap["host"], cap["path"] + (f"?{query}" if query else ""), cap["headers"])
    assert r.kind == "generate" and r.model
    p = codec.to_chat(cap["body"], r)
    msgs = p.chat["messages"]
    assert msgs[0]["role"] == "system" and msgs[-1]["role"] in ("user", "tool")
    assert all(t["function"]["parameters"].get("type") == "object" for t in p.chat.get("tools", []))
    for m in msgs:
        for call in m.get("tool_calls", []):
            json.loads(call["function"]["arguments"])
    # The CLI's placeholder on echoed calls is noted, never taken for reasoning.
    assert not any("reasoning_content" in m for m in msgs)
    if any("tool_calls" in m for m in msgs):
        assert {"thought_signature_placeholder_ignored", "reasoning_dropped"} <= set(p.normalizations)


# -- 6. streaming encoder (SSE) -----------------------------------------------------------------------------------


def test_6_1_sse_events_are_crlf_framed_and_parse_as_sdk_chunks():
    raw = stream_bytes(SSE, [Delta(text="Hel"), Delta(text="lo")], completion("Hello"))
    events = raw.split(b"\r\n\r\n")
    assert events[-1] == b"" and all(e.startswith(b"data: {") for e in events[:-1])
    chunks = [types.GenerateContentResponse.model_validate(orjson.loads(e[6:])) for e in events[:-1]]
    assert "".join(c.text or "" for c in chunks) == "Hello"
    last = chunks[-1]
    assert last.candidates[0].finish_reason == types.FinishReason.STOP
    assert (last.usage_metadata.prompt_token_count, last.usage_metadata.candidates_token_count,
            last.usage_metadata.total_token_count) == (11, 7, 18)
    assert last.model_version == "gemini-x" and last.response_id == "resp-1"


def test_6_2_nothing_is_sent_before_content_and_empty_deltas_send_nothing():
    enc = encoder(SSE)
    assert enc.start() == [] and enc.delta(Delta()) == [] and enc.delta(Delta(finish_reason="stop")) == []


def test_6_3_reasoning_is_a_thought_part_only_when_thoughts_were_asked():
    shown = stream_bytes(SSE, [Delta(reasoning="r1"), Delta(text="t")], completion("t", reasoning="r1"))
    hidden = stream_bytes(SSE, [Delta(reasoning="r1"), Delta(text="t")], completion("t", reasoning="r1"),
                          include_thoughts=False)
    assert b'{"text":"r1","thought":true}' in shown and b'"thought":true' not in hidden
    # Either way the reasoning travels in the signature of the closing event.
    for raw in (shown, hidden):
        last = orjson.loads(raw.split(b"\r\n\r\n")[-2][6:])
        sig = last["candidates"][0]["content"]["parts"][-1]["thoughtSignature"]
        assert codec.decode_signature(sig) == {"r": "r1", "a": []}


def test_6_4_finish_reasons_and_provider_stop_reason():
    assert codec.provider_stop_reason(completion(finish="length")) == "MAX_TOKENS"
    assert codec.provider_stop_reason(completion(finish="stop")) == "STOP"
    assert codec.provider_stop_reason(completion(calls=[ToolCall("c", "f", "{}")])) == "STOP"
    assert codec.provider_stop_reason(completion(finish="abort")) == "OTHER"


def test_6_5_invalid_tool_arguments_are_kept_raw_and_noted_never_crash():
    enc = encoder(SSE)
    raw = b"".join(enc.finish(completion(calls=[ToolCall("c", "f", '{"a": 1'), ToolCall("d", "g", "[1]")])))
    parts = orjson.loads(raw[6:].split(b"\r\n\r\n")[0])["candidates"][0]["content"]["parts"]
    assert parts[0]["functionCall"]["args"] == {"__raw_arguments__": '{"a": 1'}
    assert parts[1]["functionCall"]["args"] == {"__raw_arguments__": "[1]"}
    assert "invalid_tool_arguments_kept_raw" in enc.notes


def _chunks(draw, text: str) -> list[str]:
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=6))) if len(text) > 1 else []
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


ARG_VALUES = st.dictionaries(st.text("abcxyz_", min_size=1, max_size=5),
                             st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.none()), max_size=3)


@st.composite
def scripts(draw):
    """A backend stream: reasoning → text → parallel tool calls, every piece re-chunked at random points."""
    reasoning = draw(st.text(max_size=30))
    text = draw(st.text(max_size=30))
    calls = [ToolCall(f"chatcmpl-tool-{i}", draw(st.sampled_from(["run_shell_command", "read_file", "glob"])),
                      json.dumps(draw(ARG_VALUES), ensure_ascii=draw(st.booleans())))
             for i in range(draw(st.integers(0, 3)))]
    deltas = [Delta(reasoning=c) for c in _chunks(draw, reasoning)] + [Delta(text=c) for c in _chunks(draw, text)]
    for i, call in enumerate(calls):
        pieces = _chunks(draw, call.arguments)
        deltas.append(Delta(tool_calls=(ToolCallDelta(i, id=call.id, name=call.name, arguments=pieces[0]),)))
        deltas += [Delta(tool_calls=(ToolCallDelta(i, arguments=p),)) for p in pieces[1:]]
    finish = "tool_calls" if calls else draw(st.sampled_from(["stop", "length"]))
    deltas.append(Delta(finish_reason=finish))
    return deltas, completion(text, reasoning, calls, finish, prompt=draw(st.integers(1, 9999)),
                              completion_tokens=draw(st.integers(1, 999)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts(), st.booleans())
def test_6_6_any_rechunked_stream_parses_in_the_sdk_stream(script, include_thoughts):
    deltas, comp = script

    def handler(request: httpx.Request) -> httpx.Response:
        r = codec.route(request.method, request.url.host, request.url.raw_path.decode(), request.headers)
        assert r.kind == "generate" and r.stream and r.sse and r.model == "gemini-x"
        return httpx.Response(200, headers={"content-type": codec.STREAM_CONTENT_TYPE},
                              content=stream_bytes(r, deltas, comp, include_thoughts))

    chunks = list(sdk_client(handler).models.generate_content_stream(model="gemini-x", contents="hi"))
    parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]
    thoughts = "".join(p.text for p in parts if p.thought)
    assert thoughts == (comp.reasoning if include_thoughts else "")
    assert "".join(p.text for p in parts if p.text is not None and not p.thought) == comp.content
    calls = [p.function_call for p in parts if p.function_call]
    assert [(c.id, c.name, c.args) for c in calls] == [(t.id, t.name, json.loads(t.arguments)) for t in comp.tool_calls]
    last = chunks[-1]
    assert last.candidates[0].finish_reason == (
        types.FinishReason.MAX_TOKENS if comp.finish_reason == "length" else types.FinishReason.STOP)
    assert last.usage_metadata.prompt_token_count == comp.prompt_tokens
    assert last.usage_metadata.candidates_token_count == comp.completion_tokens
    assert last.usage_metadata.total_token_count == comp.prompt_tokens + comp.completion_tokens
    if comp.tool_calls:
        sig = [p for p in parts if p.function_call][0].thought_signature
        payload = codec.decode_signature(base64.b64encode(sig).decode())
        assert payload == {"r": comp.reasoning, "a": [t.arguments for t in comp.tool_calls]}


# -- 7. JSON array stream (no alt=sse) ----------------------------------------------------------------------------


def test_7_1_array_stream_is_one_json_array_written_element_by_element():
    enc = encoder(ARRAY)
    pieces = enc.start() + enc.delta(Delta(text="a")) + enc.delta(Delta(text="b"))
    pieces += enc.finish(completion("ab", calls=[ToolCall("c", "f", '{"x": 1}')]))
    raw = b"".join(pieces)
    assert raw.startswith(b"[{") and raw.endswith(b"\n]") and b"\n,\r\n{" in raw
    elements = json.loads(raw)
    resp = [types.GenerateContentResponse.model_validate(e) for e in elements]
    assert [r.text for r in resp[:2]] == ["a", "b"]
    assert resp[-1].function_calls[0].args == {"x": 1}
    assert resp[-1].candidates[0].finish_reason == types.FinishReason.STOP
    # Each piece but the closing bracket completes exactly one element: a client can parse as bytes arrive.
    assert pieces[-1] == b"]" and all(p.rstrip().endswith(b"}") for p in pieces[:-1])


def test_7_2_array_stream_error_is_a_last_element_and_the_array_closes():
    enc = encoder(ARRAY)
    raw = b"".join(enc.delta(Delta(text="a")) + enc.error(GatewayError("unavailable", "backend lost")))
    elements = json.loads(raw)
    assert elements[-1] == {"error": {"code": 503, "message": "backend lost", "status": "UNAVAILABLE"}}
    only = b"".join(encoder(ARRAY).error(GatewayError("unavailable", "down")))
    assert json.loads(only) == [{"error": {"code": 503, "message": "down", "status": "UNAVAILABLE"}}]


# -- 8. non-streaming response ------------------------------------------------------------------------------------


def test_8_1_generate_content_parses_text_thoughts_calls_and_usage_in_the_sdk():
    comp = completion("done", reasoning="why", calls=[ToolCall("chatcmpl-tool-1", "glob", '{"pattern": "*.py"}')])
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        r = codec.route(request.method, request.url.host, request.url.raw_path.decode(), request.headers)
        seen.append(r)
        plan = codec.to_chat(json.loads(request.content), r)
        enc = codec.Encoder(EncodeContext(plan, r, "resp-9", model=r.model, prompt_tokens=11))
        return httpx.Response(200, json=enc.response(comp))

    resp = sdk_client(handler).models.generate_content(
        model="gemini-x", contents="hi",
        config=types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True)))
    assert seen[0].stream is False
    assert resp.text == "done"
    assert resp.candidates[0].content.parts[0].thought is True and resp.candidates[0].content.parts[0].text == "why"
    assert [(c.id, c.name, c.args) for c in resp.function_calls] == [("chatcmpl-tool-1", "glob", {"pattern": "*.py"})]
    assert resp.usage_metadata.total_token_count == 18 and resp.response_id == "resp-9"


def test_8_2_router_side_call_answer_parses_as_the_requested_json():
    schema = {"type": "OBJECT", "properties": {"model_choice": {"type": "STRING", "enum": ["flash", "pro"]}},
              "required": ["model_choice"]}

    def handler(request: httpx.Request) -> httpx.Response:
        r = codec.route(request.method, request.url.host, request.url.raw_path.decode(), request.headers)
        plan = codec.to_chat(json.loads(request.content), r)
        assert plan.constrained and plan.chat["response_format"]["json_schema"]["schema"]["type"] == "object"
        enc = codec.Encoder(EncodeContext(plan, r, "resp-r", model=r.model))
        return httpx.Response(200, json=enc.response(completion('{"model_choice": "flash"}')))

    resp = sdk_client(handler).models.generate_content(
        model="gemini-x", contents="route this",
        config=types.GenerateContentConfig(response_mime_type="application/json", response_json_schema=schema))
    assert json.loads(resp.text) == {"model_choice": "flash"}


def test_8_3_empty_answer_is_still_a_valid_response():
    resp = types.GenerateContentResponse.model_validate(encoder(GEN).response(completion("", finish="length")))
    assert resp.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS and not resp.function_calls


# -- 9. round trip through the SDK --------------------------------------------------------------------------------


def test_9_1_two_turn_tool_use_restores_reasoning_ids_and_exact_arguments():
    raw_args = '{"command":"echo hi"}'  # the backend's exact text, not json.dumps style
    turns = [completion(reasoning="need a shell", calls=[ToolCall("chatcmpl-tool-7", "run_shell_command", raw_args)]),
             completion("hi")]
    plans = []

    def handler(request: httpx.Request) -> httpx.Response:
        r = codec.route(request.method, request.url.host, request.url.raw_path.decode(), request.headers)
        plan = codec.to_chat(json.loads(request.content), r)
        plans.append(plan)
        comp = turns[len(plans) - 1]
        enc = codec.Encoder(EncodeContext(plan, r, f"resp-{len(plans)}", model=r.model, prompt_tokens=11))
        events = enc.delta(Delta(reasoning=comp.reasoning, text=comp.content)) + enc.finish(comp)
        return httpx.Response(200, content=b"".join(events))

    client = sdk_client(handler)
    tools = [types.Tool(function_declarations=[types.FunctionDeclaration(
        name="run_shell_command", parameters=types.Schema(type="OBJECT", properties={
            "command": types.Schema(type="STRING")}, required=["command"]))])]
    config = types.GenerateContentConfig(tools=tools, automatic_function_calling=types.AutomaticFunctionCallingConfig(
        disable=True), thinking_config=types.ThinkingConfig(include_thoughts=True))
    history = [types.Content(role="user", parts=[types.Part(text="say hi")])]
    chunks = list(client.models.generate_content_stream(model="gemini-x", contents=history, config=config))
    model_parts = [p for c in chunks for p in c.candidates[0].content.parts if not p.thought]
    call = next(p.function_call for p in model_parts if p.function_call)
    history += [types.Content(role="model", parts=model_parts),
                types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                    id=call.id, name=call.name, response={"output": "hi"}))])]
    final = list(client.models.generate_content_stream(model="gemini-x", contents=history, config=config))
    assert "".join(c.text or "" for c in final) == "hi"

    assert plans[0].chat["tools"][0]["function"]["parameters"]["type"] == "object"
    msgs = plans[1].chat["messages"]
    assert msgs[1] == {"role": "assistant", "content": None, "reasoning_content": "need a shell", "tool_calls": [
        {"id": "chatcmpl-tool-7", "type": "function", "function": {"name": "run_shell_command",
                                                                    "arguments": raw_args}}]}
    assert msgs[2] == {"role": "tool", "tool_call_id": "chatcmpl-tool-7", "content": '{"output": "hi"}'}
    assert plans[1].normalizations == ("schema_types_lowercased",)  # nothing about signatures or reasoning


# -- 10. errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "code", "status"),
    [
        ("rate_limited", 429, "RESOURCE_EXHAUSTED"),
        ("unavailable", 503, "UNAVAILABLE"),
        ("context_overflow", 400, "INVALID_ARGUMENT"),
        ("too_large", 400, "INVALID_ARGUMENT"),
        ("bad_request", 400, "INVALID_ARGUMENT"),
        ("not_found", 404, "NOT_FOUND"),
    ],
)
def test_10_1_error_table(kind, code, status):
    got, raw = codec.error_response(GatewayError(kind, "why"))
    assert got == code and orjson.loads(raw) == {"error": {"code": code, "message": "why", "status": status}}


def test_10_2_status_override_keeps_googles_shape():
    code, raw = codec.error_response(GatewayError("bad_request", "image too big", status=400))
    assert code == 400 and orjson.loads(raw)["error"]["status"] == "INVALID_ARGUMENT"
    assert codec.error_response(GatewayError("too_large", "big", status=413))[0] == 400


def test_10_3_sdk_raises_the_providers_errors_before_and_after_headers():
    def before(request):
        code, raw = codec.error_response(AgentInputError("contents must be a non-empty list"))
        return httpx.Response(code, content=raw, headers={"content-type": codec.JSON_CONTENT_TYPE})

    with pytest.raises(genai_errors.ClientError) as exc:
        sdk_client(before).models.generate_content(model="gemini-x", contents="hi")
    assert exc.value.code == 400 and exc.value.status == "INVALID_ARGUMENT"

    def midstream(request):
        enc = encoder(SSE)
        raw = b"".join(enc.delta(Delta(text="par")) + enc.error(GatewayError("unavailable", "backend lost")))
        return httpx.Response(200, content=raw, headers={"content-type": codec.STREAM_CONTENT_TYPE})

    got = []
    with pytest.raises(genai_errors.ServerError) as exc:
        for c in sdk_client(midstream).models.generate_content_stream(model="gemini-x", contents="hi"):
            got.append(c.text)
    assert got == ["par"] and exc.value.code == 503 and exc.value.status == "UNAVAILABLE"
