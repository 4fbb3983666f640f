"""OpenAI Responses codec: routing, session keys, item folding, tool mapping (custom and namespaced tools), and the
encoder checked by the official `openai` SDK (its own event types, `responses.stream` accumulator and `Response`
parsing) over an in-memory httpx transport — no sockets.

Scenarios: 1.x routing · 2.x session keys · 3.x to_chat · 4.x captured Codex bodies · 5.x streaming encoder ·
6.x non-streaming response and round trips · 7.x errors.
"""

from __future__ import annotations

import base64
import json
import os

import httpx
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent

from polar.addon.codecs import openai_responses as codec
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
GEN = Route(protocol="openai_responses", kind="generate")
BACKEND_ONLY = (b"token_ids", b"prompt_token_ids", b"weight_versions", b"stop_reason")


def body(**kw):
    base = {"model": "gpt-5", "input": "hi"}
    base.update(kw)
    return base


def plan_of(**kw) -> ChatPlan:
    return codec.to_chat(body(**kw), GEN)


# -- 1. routing ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "host", "path", "headers", "kind"),
    [
        ("POST", "api.openai.com", "/v1/responses", [], "generate"),
        ("POST", "API.OpenAI.com:443", "/v1/responses?x=1", [], "generate"),
        ("POST", "chatgpt.com", "/backend-api/codex/responses", [], "generate"),
        ("GET", "api.openai.com", "/v1/responses", [("Upgrade", "websocket"), ("Connection", "Upgrade")],
         "websocket"),
        ("GET", "chatgpt.com", "/backend-api/codex/responses", {"upgrade": "WebSocket"}, "websocket"),
        ("POST", "api.openai.com", "/v1/responses/input_tokens", [], "count_tokens"),
        ("GET", "api.openai.com", "/v1/responses", [], "not_found"),
        ("GET", "api.openai.com", "/v1/responses/resp_1", [], "not_found"),
        ("POST", "api.openai.com", "/v1/responses/compact", [], "not_found"),
        ("GET", "api.openai.com", "/v1/models", [], "not_found"),
        ("GET", "chatgpt.com", "/backend-api/codex/models", [], "not_found"),
        ("GET", "chatgpt.com", "/", [], "not_found"),
    ],
)
def test_1_1_provider_hosts_route_generate_websocket_count_or_not_found(method, host, path, headers, kind):
    r = codec.route(method, host, path, headers)
    assert r is not None and r.protocol == "openai_responses" and r.kind == kind


@pytest.mark.parametrize(
    ("host", "path"),
    [
        ("api.openai.com", "/v1/chat/completions"),
        ("api.openai.com", "/v1/chat/completions/"),
        ("api.anthropic.com", "/v1/messages"),
        ("ab.chatgpt.com", "/backend-api/codex/responses"),
        ("dashscope.aliyuncs.com", "/compatible-mode/v1/chat/completions"),
    ],
)
def test_1_2_chat_completions_and_other_hosts_are_not_ours(host, path):
    assert codec.route("POST", host, path, []) is None


# -- 2. session keys -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "b", "source", "value"),
    [
        ([("session-id", "codex-1"), ("session_id", "pi-1")], {"prompt_cache_key": "k"}, "harness:session-id",
         "codex-1"),
        ([(b"Session_Id", b"pi-1")], {"prompt_cache_key": "k"}, "harness:session_id", "pi-1"),
        ({}, {"prompt_cache_key": "k"}, "harness:prompt_cache_key", "k"),
    ],
)
def test_2_1_codex_header_then_pi_header_then_prompt_cache_key(headers, b, source, value):
    key = codec.session_key(headers, b)
    assert key is not None and (key.source, key.value) == (source, value)


@pytest.mark.parametrize("b", [None, {}, {"prompt_cache_key": ""}, {"metadata": {"sessionId": "x"}}])
def test_2_2_no_session_key_is_invented(b):
    assert codec.session_key([("thread-id", "t")], b) is None


# -- 3. to_chat ----------------------------------------------------------------------------------------------------


def test_3_1_instructions_and_string_input():
    p = plan_of(instructions="be brief", stream=True)
    assert p.chat["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert p.stream is True and p.model_requested == "gpt-5" and p.constrained is False
    assert p.extra["thinking"] is None


def test_3_2_message_roles_parts_and_developer_as_system():
    p = plan_of(input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "look "},
                                     {"type": "input_text", "text": "here"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "img:"},
                                     {"type": "input_image", "image_url": "data:image/png;base64,AAAA",
                                      "detail": "low"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}],
         "id": "msg_1", "status": "completed"},
        {"role": "system", "content": "mid-conversation system"},
    ])
    assert p.chat["messages"] == [
        {"role": "system", "content": "dev"},
        {"role": "user", "content": "look here"},
        {"role": "user", "content": [{"type": "text", "text": "img:"},
                                     {"type": "image_url",
                                      "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}]},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "mid-conversation system"},
    ]
    assert "developer_as_system" in p.normalizations


def test_3_3_consecutive_function_calls_merge_into_one_assistant_message():
    p = plan_of(tools=[{"type": "function", "name": "sh", "parameters": {"type": "object"}}], input=[
        {"role": "user", "content": "go"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "running"}]},
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": '{"cmd":"a"}'},
        {"type": "function_call", "call_id": "c2", "name": "sh", "arguments": '{"cmd":"b"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "A"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "B1\n"}, {"type": "input_text", "text": "B2"}]},
    ])
    assistant = p.chat["messages"][1]
    assert assistant == {"role": "assistant", "content": "running", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": '{"cmd":"a"}'}},
        {"id": "c2", "type": "function", "function": {"name": "sh", "arguments": '{"cmd":"b"}'}}]}
    assert p.chat["messages"][2:] == [{"role": "tool", "tool_call_id": "c1", "content": "A"},
                                      {"role": "tool", "tool_call_id": "c2", "content": "B1\nB2"}]
    assert p.chat["tools"] == [{"type": "function", "function": {"name": "sh", "parameters": {"type": "object"}}}]


def test_3_4_custom_tool_is_a_function_with_one_string_input_and_its_calls_echo_as_arguments():
    grammar = {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}
    p = plan_of(tools=[{"type": "custom", "name": "exec", "description": "run js", "format": grammar}], input=[
        {"role": "user", "content": "go"},
        {"type": "custom_tool_call", "call_id": "c1", "name": "exec", "input": 'text("hi \\"x\\"")'},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "hi"}]},
    ])
    fn = p.chat["tools"][0]["function"]
    assert fn["name"] == "exec" and fn["description"] == "run js"
    assert fn["parameters"]["required"] == ["input"]
    assert fn["parameters"]["properties"]["input"]["type"] == "string"
    call = p.chat["messages"][1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"input": 'text("hi \\"x\\"")'}
    assert p.chat["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "hi"}
    assert "custom_tool_as_function:exec" in p.normalizations
    assert "custom_tool_grammar_unenforced:exec" in p.normalizations
    assert p.extra["tool_names"]["exec"] == [None, "exec", "custom"]


def test_3_5_namespaces_functions_keeps_bare_names_others_are_prefixed_and_history_follows():
    p = plan_of(tools=[
        {"type": "namespace", "name": "functions", "tools": [{"type": "function", "name": "wait"}]},
        {"type": "namespace", "name": "clock", "description": "time",
         "tools": [{"type": "function", "name": "sleep", "parameters": {"type": "object"}},
                   {"type": "custom", "name": "cron"}]},
    ], input=[
        {"role": "user", "content": "sleep"},
        {"type": "function_call", "call_id": "c1", "name": "sleep", "namespace": "clock", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "wait", "namespace": "functions", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "slept"},
        {"type": "function_call_output", "call_id": "c2", "output": "waited"},
    ])
    assert [t["function"]["name"] for t in p.chat["tools"]] == ["wait", "clock__sleep", "clock__cron"]
    assert [c["function"]["name"] for c in p.chat["messages"][1]["tool_calls"]] == ["clock__sleep", "wait"]
    assert p.extra["tool_names"]["clock__sleep"] == ["clock", "sleep", "function"]
    assert p.extra["tool_names"]["clock__cron"] == ["clock", "cron", "custom"]
    assert "namespaced_tools:clock" in p.normalizations
    assert not any(n.startswith("namespaced_tools:functions") for n in p.normalizations)


def test_3_6_our_encrypted_reasoning_is_restored_on_the_next_assistant_message():
    ours = codec.encode_reasoning("I should call sh. ünïcode ✓")
    p = plan_of(input=[
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": ours},
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "visible only"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "finished"}]},
    ])
    msgs = p.chat["messages"]
    assert msgs[1]["reasoning_content"] == "I should call sh. ünïcode ✓" and msgs[1]["tool_calls"]
    assert msgs[3] == {"role": "assistant", "content": "finished", "reasoning_content": "visible only"}
    assert "reasoning_dropped" not in p.normalizations


def test_3_7_foreign_or_empty_reasoning_is_dropped_and_noted_and_corrupt_ours_is_a_400():
    p = plan_of(input=[
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "theirs"}],
         "encrypted_content": "gAAAAABfOreignBlob"},
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": "answer"},
    ])
    assert p.chat["messages"][1] == {"role": "assistant", "content": "answer"}
    assert {"foreign_reasoning_dropped", "reasoning_dropped"} <= set(p.normalizations)
    with pytest.raises(AgentInputError, match="corrupt"):
        plan_of(input=[{"type": "reasoning", "summary": [], "encrypted_content": "polar:v1:***"}])


def test_3_8_additional_tools_configuration_update_and_unknown_items_are_noted_not_fatal():
    p = plan_of(input=[
        {"type": "additional_tools", "role": "developer",
         "tools": [{"type": "namespace", "name": "functions", "tools": [{"type": "custom", "name": "exec"}]}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}],
         "internal_chat_message_metadata_passthrough": {"turn_id": "t"}},
        {"type": "configuration_update", "reasoning": {"effort": "low"}},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
        {"type": "brand_new_item"},
    ])
    assert p.chat["messages"] == [{"role": "user", "content": "hi"}]
    assert [t["function"]["name"] for t in p.chat["tools"]] == ["exec"]
    for note in ("additional_tools_as_tools", "ignored_item:configuration_update", "dropped_item:web_search_call",
                 "dropped_item:brand_new_item"):
        assert note in p.normalizations


def test_3_9_server_tools_are_dropped_and_noted():
    p = plan_of(tools=[{"type": "web_search", "external_web_access": True}, {"type": "file_search"},
                       {"type": "function", "name": "f"}])
    assert [t["function"]["name"] for t in p.chat["tools"]] == ["f"]
    assert "dropped_server_tool:web_search" in p.normalizations
    assert "dropped_server_tool:file_search" in p.normalizations


@pytest.mark.parametrize(
    ("choice", "chat_choice", "constrained"),
    [
        ("auto", "auto", False),
        ("none", "none", False),
        ("required", "required", True),
        ({"type": "function", "name": "f"}, {"type": "function", "function": {"name": "f"}}, True),
        ({"type": "custom", "name": "exec"}, {"type": "function", "function": {"name": "exec"}}, True),
        ({"type": "function", "name": "sleep", "namespace": "clock"},
         {"type": "function", "function": {"name": "clock__sleep"}}, True),
    ],
)
def test_3_10_tool_choice(choice, chat_choice, constrained):
    p = plan_of(tool_choice=choice, parallel_tool_calls=False, tools=[
        {"type": "function", "name": "f"}, {"type": "custom", "name": "exec"},
        {"type": "namespace", "name": "clock", "tools": [{"type": "function", "name": "sleep"}]}])
    assert p.chat["tool_choice"] == chat_choice and p.constrained is constrained
    assert p.chat["parallel_tool_calls"] is False


def test_3_11_allowed_tools_filter_the_list():
    p = plan_of(tools=[{"type": "function", "name": "a"}, {"type": "function", "name": "b"}],
                tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function",
                                                                                     "name": "b"}]})
    assert [t["function"]["name"] for t in p.chat["tools"]] == ["b"]
    assert p.chat["tool_choice"] == "required" and p.constrained


@pytest.mark.parametrize(
    ("reasoning", "thinking"),
    [(None, None), ({"effort": "high", "summary": "auto"}, True), ({"effort": "none"}, False),
     ({"summary": "auto"}, None), ({"effort": "low", "context": "all_turns"}, True)],
)
def test_3_12_reasoning_effort_becomes_the_thinking_intent(reasoning, thinking):
    p = plan_of(reasoning=reasoning)
    assert p.extra["thinking"] is thinking
    assert "chat_template_kwargs" not in p.chat


def test_3_13_text_format_json_schema_is_constrained_and_json_object_is_not():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    p = plan_of(text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}})
    assert p.chat["response_format"] == {"type": "json_schema",
                                         "json_schema": {"name": "out", "schema": schema, "strict": True}}
    assert p.constrained
    p = plan_of(text={"format": {"type": "json_object"}})
    assert p.chat["response_format"] == {"type": "json_object"} and not p.constrained
    p = plan_of(text={"format": {"type": "text"}, "verbosity": "low"})
    assert "response_format" not in p.chat and "dropped_text_verbosity" in p.normalizations


def test_3_14_sampling_max_output_tokens_and_dropped_fields():
    p = plan_of(max_output_tokens=64, temperature=0.3, top_p=0.9, store=False, prompt_cache_key="k",
                metadata={"a": "b"}, service_tier="flex", include=["reasoning.encrypted_content",
                                                                   "web_search_call.action.sources"])
    assert {k: p.chat[k] for k in ("max_tokens", "temperature", "top_p")} == {"max_tokens": 64,
                                                                             "temperature": 0.3, "top_p": 0.9}
    assert "dropped_field:service_tier" in p.normalizations
    assert "dropped_include:web_search_call.action.sources" in p.normalizations
    assert p.extra["encrypted_reasoning"] is True and p.agent_top_logprobs is None
    assert set(p.chat) == {"messages", "max_tokens", "temperature", "top_p"}


def test_3_15_agent_logprobs_are_remembered_not_forwarded():
    p = plan_of(include=["message.output_text.logprobs"], top_logprobs=3)
    assert p.agent_top_logprobs == 3 and "logprobs" not in p.chat and "top_logprobs" not in p.chat
    assert plan_of(include=["message.output_text.logprobs"]).agent_top_logprobs == 0


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id is not supported"),
        ({"conversation": "conv_1"}, "conversation is not supported"),
        ({"prompt": {"id": "pmpt_1"}}, "stored prompt"),
        ({"background": True}, "background"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": 3}, "'input' must be"),
        ({"input": []}, "no input"),
        ({"input": [{"role": "tool", "content": "x"}]}, "role 'tool'"),
        ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}]},
         "only supported in user"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]}, "file_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_data": "x"}]}]}, "input_file"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "'output' is required"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "x", "input": 1}]}, "string 'input'"),
        ({"tools": {"type": "function"}}, "must be a list"),
        ({"tools": [{"type": "function"}]}, "needs a string 'name'"),
        ({"tools": [{"type": "mystery"}]}, "tool type 'mystery'"),
        ({"tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f", "description": "x"}]},
         "both named 'f'"),
        ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
         "not among the tools"),
        ({"tool_choice": {"type": "web_search"}}, "server-side tool"),
        ({"temperature": 5}, "temperature"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema"}}}, "schema"),
        ({"instructions": ["x"]}, "instructions"),
    ],
)
def test_3_16_bad_input_is_a_clear_400(fields, needle):
    with pytest.raises(AgentInputError, match=needle.replace("(", r"\(")) as exc:
        plan_of(**fields)
    assert exc.value.kind == "bad_request"


def test_3_17_a_body_that_is_not_an_object_is_a_400():
    with pytest.raises(AgentInputError):
        codec.to_chat([1, 2], GEN)  # type: ignore[arg-type]


# -- 4. captured Codex bodies --------------------------------------------------------------------------------------


def _captures() -> list[str]:
    folder = os.path.join(CAPTURES, "codex")
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json"))


def _all_responses_captures() -> list[str]:
    out = []
    if os.path.isdir(CAPTURES):
        for cli in sorted(os.listdir(CAPTURES)):
            folder = os.path.join(CAPTURES, cli)
            for f in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                if f.endswith(".json"):
                    with open(os.path.join(folder, f)) as fh:
                        cap = json.load(fh)
                    if codec.route(cap["method"], cap["host"], cap["path"], cap["headers"]):
                        out.append(os.path.join(folder, f))
    return out


def test_4_0_codex_captures_are_present():
    if not os.path.isdir(CAPTURES):
        pytest.skip("../shared/captures is not present")
    assert len(_captures()) >= 6


@pytest.mark.parametrize("path", _all_responses_captures(), ids=os.path.basename)
def test_4_1_every_captured_responses_body_translates(path):
    with open(path) as fh:
        cap = json.load(fh)
    r = codec.route(cap["method"], cap["host"], cap["path"], cap["headers"])
    assert r.kind == "generate"
    key = codec.session_key(cap["headers"], cap["body"])
    assert key is not None and key.source == "harness:session-id"
    p = codec.to_chat(cap["body"], r)
    roles = [m["role"] for m in p.chat["messages"]]
    assert roles[0] == "system" and "user" in roles
    assert p.chat["tools"] and p.stream is True
    assert all(not t["function"]["name"].startswith("functions__") for t in p.chat["tools"])
    if "turn2" in path:  # the tool call and its output follow the user turn
        assert roles[-2:] == ["assistant", "tool"]
        assert p.chat["messages"][-1]["tool_call_id"] == p.chat["messages"][-2]["tool_calls"][0]["id"]
        json.loads(p.chat["messages"][-2]["tool_calls"][0]["function"]["arguments"])
    orjson.dumps(p.chat)  # JSON-clean


def test_4_2_default_model_codex_exec_is_a_custom_tool_and_namespaces_are_prefixed():
    paths = [p for p in _captures() if "tool_turn2_default-model" in p]
    if not paths:
        pytest.skip("Codex default-model capture absent")
    with open(paths[0]) as fh:
        p = codec.to_chat(json.load(fh)["body"], GEN)
    names = p.extra["tool_names"]
    assert names["exec"][2] == "custom"
    assert any(n.startswith("clock__") for n in names)
    assert p.chat["messages"][-2]["tool_calls"][0]["function"]["name"] == "exec"
    assert "ignored_item:configuration_update" in p.normalizations


# -- 5. streaming encoder ------------------------------------------------------------------------------------------


def make_encoder(**body_fields) -> codec.Encoder:
    plan = codec.to_chat(body(**body_fields), GEN)
    return codec.Encoder(EncodeContext(plan=plan, route=GEN, response_id="abc123", model="gpt-5",
                                       prompt_tokens=11, created=1_700_000_000))


def sdk_client(payload: bytes, status: int = 200, content_type: str = codec.STREAM_CONTENT_TYPE) -> openai.OpenAI:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type}, content=payload)

    return openai.OpenAI(api_key="sk-test", base_url="https://api.openai.com/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def sdk_events(chunks: list[bytes]) -> list:
    stream = sdk_client(b"".join(chunks)).responses.create(model="gpt-5", input="hi", stream=True)
    return list(stream)


def sdk_final(chunks: list[bytes]) -> Response:
    with sdk_client(b"".join(chunks)).responses.stream(model="gpt-5", input="hi") as stream:
        return stream.get_final_response()


def run(enc: codec.Encoder, deltas: list[Delta], completion: Completion | None) -> list[bytes]:
    out = enc.start()
    for d in deltas:
        out += enc.delta(d)
    if completion is not None:
        out += enc.finish(completion)
    return out


def completion(content="", reasoning="", calls=(), finish="stop", prompt=11, completion_tokens=7, logprobs=()):
    return Completion(content=content, reasoning=reasoning, tool_calls=tuple(calls), finish_reason=finish,
                      stop_reason=None, prompt_tokens=prompt, completion_tokens=completion_tokens, logprobs=logprobs)


def test_5_1_text_stream_is_the_full_event_sequence_with_consecutive_sequence_numbers():
    chunks = run(make_encoder(), [Delta(text="Hel"), Delta(text="lo")], completion("Hello"))
    events = sdk_events(chunks)
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for raw, event in zip(b"".join(chunks).split(b"\n\n"), events):
        assert raw.startswith(f"event: {event.type}\n".encode())
    final = events[-1].response
    assert final.status == "completed" and final.output_text == "Hello" and final.id == "resp_abc123"
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (11, 7, 18)
    assert final.usage.input_tokens_details.cached_tokens == 0
    assert events[0].response.status == "in_progress" and events[0].response.output == []


def test_5_2_reasoning_then_text_then_function_call_accumulates_in_the_sdk():
    enc = make_encoder(include=["reasoning.encrypted_content"], tools=[{"type": "function", "name": "sh"}])
    deltas = [Delta(reasoning="think"), Delta(reasoning="ing"), Delta(text="ok"),
              Delta(tool_calls=(ToolCallDelta(index=0, id="call_1", name="sh", arguments='{"c'),)),
              Delta(tool_calls=(ToolCallDelta(index=0, arguments='md":1}'),)), Delta(finish_reason="tool_calls")]
    c = completion("ok", "thinking", [ToolCall("call_1", "sh", '{"cmd":1}')], finish="tool_calls")
    chunks = run(enc, deltas, c)
    types = [e.type for e in sdk_events(chunks)]
    assert types[2:6] == ["response.output_item.added", "response.reasoning_summary_part.added",
                          "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta"]
    assert "response.function_call_arguments.done" in types
    final = sdk_final(chunks)
    rs, msg, fc = final.output
    assert rs.type == "reasoning" and rs.summary[0].text == "thinking"
    assert codec.decode_reasoning(rs.encrypted_content) == "thinking"
    assert msg.type == "message" and msg.content[0].text == "ok" and msg.status == "completed"
    assert (fc.type, fc.name, fc.call_id, fc.arguments, fc.status) == ("function_call", "sh", "call_1",
                                                                       '{"cmd":1}', "completed")
    assert fc.namespace is None


def test_5_3_no_encrypted_content_unless_the_agent_included_it():
    final = sdk_final(run(make_encoder(), [Delta(reasoning="r"), Delta(text="t")], completion("t", "r")))
    assert final.output[0].encrypted_content is None and final.output[0].summary[0].text == "r"


def test_5_4_custom_tool_call_input_streams_decoded():
    enc = make_encoder(tools=[{"type": "custom", "name": "exec"}])
    args = json.dumps({"input": 'print("é ✓ 😀")\n\tdone\\'})  # ASCII escapes: \u00e9, surrogate pairs, \\
    pieces = [args[i:i + 3] for i in range(0, len(args), 3)]
    deltas = [Delta(tool_calls=(ToolCallDelta(index=0, id="call_x" if i == 0 else None,
                                              name="exec" if i == 0 else None, arguments=p),))
              for i, p in enumerate(pieces)]
    chunks = run(enc, deltas, completion(calls=[ToolCall("call_x", "exec", args)], finish="tool_calls"))
    events = sdk_events(chunks)
    streamed = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert streamed == 'print("é ✓ 😀")\n\tdone\\'
    assert sum(e.type == "response.custom_tool_call_input.delta" for e in events) > 3  # really incremental
    done = [e for e in events if e.type == "response.custom_tool_call_input.done"][0]
    assert done.input == streamed
    item = sdk_final(chunks).output[0]
    assert (item.type, item.name, item.call_id, item.input) == ("custom_tool_call", "exec", "call_x", streamed)


def test_5_5_custom_tool_arguments_in_another_shape_arrive_whole_at_the_end():
    enc = make_encoder(tools=[{"type": "custom", "name": "exec"}])
    deltas = [Delta(tool_calls=(ToolCallDelta(index=0, id="c", name="exec", arguments='{"other": 1, '),)),
              Delta(tool_calls=(ToolCallDelta(index=0, arguments='"input": "x"}'),))]
    events = sdk_events(run(enc, deltas, completion(calls=[ToolCall("c", "exec", '{"other": 1, "input": "x"}')])))
    assert [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"] == ["x"]
    enc = make_encoder(tools=[{"type": "custom", "name": "exec"}])
    raw = "not json at all"
    events = sdk_events(run(enc, [Delta(tool_calls=(ToolCallDelta(index=0, id="c", name="exec", arguments=raw),))],
                            completion(calls=[ToolCall("c", "exec", raw)])))
    assert [e for e in events if e.type == "response.custom_tool_call_input.done"][0].input == raw


def test_5_5b_a_custom_input_cut_by_the_token_budget_keeps_what_was_streamed():
    enc = make_encoder(tools=[{"type": "custom", "name": "exec"}])
    cut = '{"input": "line 1\\nline'
    events = sdk_events(run(enc, [Delta(tool_calls=(ToolCallDelta(index=0, id="c", name="exec", arguments=cut),))],
                            completion(calls=[ToolCall("c", "exec", cut)], finish="length")))
    streamed = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    done = [e for e in events if e.type == "response.custom_tool_call_input.done"][0]
    assert streamed == done.input == "line 1\nline"
    assert events[-1].type == "response.incomplete"
    assert [e.item.status for e in events if e.type == "response.output_item.done"] == ["incomplete"]


def test_5_6_namespaced_call_is_answered_with_bare_name_and_namespace():
    enc = make_encoder(tools=[
        {"type": "namespace", "name": "clock", "tools": [{"type": "function", "name": "sleep"}]},
        {"type": "namespace", "name": "functions", "tools": [{"type": "custom", "name": "exec"}]}])
    deltas = [Delta(tool_calls=(ToolCallDelta(index=0, id="c1", name="clock__sleep", arguments='{"ms":1}'),
                                ToolCallDelta(index=1, id="c2", name="exec", arguments='{"input":"x"}')))]
    final = sdk_final(run(enc, deltas, completion(finish="tool_calls")))
    sleep, exec_ = final.output
    assert (sleep.type, sleep.name, sleep.namespace) == ("function_call", "sleep", "clock")
    assert (exec_.type, exec_.name, exec_.namespace) == ("custom_tool_call", "exec", None)


def test_5_7_length_finish_is_response_incomplete_with_max_output_tokens():
    chunks = run(make_encoder(max_output_tokens=2), [Delta(text="cut")], completion("cut", finish="length"))
    events = sdk_events(chunks)
    assert events[-1].type == "response.incomplete"
    resp = events[-1].response
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[0].status == "incomplete" and resp.max_output_tokens == 2
    assert codec.provider_stop_reason(completion(finish="length")) == "incomplete:max_output_tokens"
    assert codec.provider_stop_reason(completion(finish="tool_calls")) == "completed"


@pytest.mark.parametrize(("kind", "code"), [("unavailable", "server_error"), ("rate_limited", "rate_limit_exceeded"),
                                            ("context_overflow", "context_length_exceeded")])
def test_5_8_mid_stream_failure_is_response_failed(kind, code):
    enc = make_encoder()
    chunks = run(enc, [Delta(text="par")], None) + enc.error(GatewayError(kind, "backend went away"))
    events = sdk_events(chunks)
    assert events[-1].type == "response.failed"
    resp = events[-1].response
    assert resp.status == "failed" and resp.error.code == code and resp.error.message == "backend went away"
    assert resp.output[0].status == "incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert enc.finish(completion("par")) == [] and enc.delta(Delta(text="x")) == []


def test_5_9_logprobs_only_when_the_agent_asked_and_no_backend_fields_leak():
    lp = ({"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "token_id": 9,
           "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                            {"token": "Ho", "logprob": -1.5, "bytes": [72, 111]}]},)
    plain = b"".join(run(make_encoder(), [Delta(text="Hi", logprobs=lp)], completion("Hi", logprobs=lp)))
    assert b"-0.5" not in plain
    for field in BACKEND_ONLY + (b"token_id",):
        assert field not in plain
    asked = run(make_encoder(include=["message.output_text.logprobs"], top_logprobs=1),
                [Delta(text="Hi", logprobs=lp)], completion("Hi", logprobs=lp))
    events = sdk_events(asked)
    delta = [e for e in events if e.type == "response.output_text.delta"][0]
    assert delta.logprobs[0].logprob == -0.5 and len(delta.logprobs[0].top_logprobs) == 1
    assert b"token_id" not in b"".join(asked)


def test_5_10_an_empty_generation_completes_with_no_items():
    final = sdk_final(run(make_encoder(), [Delta(finish_reason="stop")], completion("", completion_tokens=1)))
    assert final.status == "completed" and final.output == [] and final.usage.output_tokens == 1


def _split(s: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(s) + 1) for c in cuts} | {0, len(s)})
    return [s[a:b] for a, b in zip(points, points[1:]) if s[a:b]]


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
NAMES = st.sampled_from(["sh", "exec", "clock__sleep"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reasoning=TEXT, content=TEXT,
       calls=st.lists(st.tuples(NAMES, TEXT, st.booleans()), max_size=3), data=st.data())
def test_5_11_any_rechunking_accumulates_to_the_same_response(reasoning, content, calls, data):
    tools = [{"type": "function", "name": "sh"}, {"type": "custom", "name": "exec"},
             {"type": "namespace", "name": "clock", "tools": [{"type": "function", "name": "sleep"}]}]
    enc = make_encoder(tools=tools, include=["reasoning.encrypted_content"])
    deltas: list[Delta] = [Delta(reasoning=p) for p in _split(reasoning, data.draw(st.lists(st.integers(0, 99))))]
    deltas += [Delta(text=p) for p in _split(content, data.draw(st.lists(st.integers(0, 99))))]
    pieces, expected = [], []
    for i, (name, value, ascii_escapes) in enumerate(calls):
        args = json.dumps({"input": value} if name == "exec" else {"v": value}, ensure_ascii=ascii_escapes)
        expected.append(ToolCall(f"call_{i}", name, args))
        parts = _split(args, data.draw(st.lists(st.integers(0, 99))))
        pieces.append([ToolCallDelta(index=i, id=f"call_{i}", name=name, arguments=parts[0])] +
                      [ToolCallDelta(index=i, arguments=p) for p in parts[1:]])
    # parallel calls interleave their fragments in any order that keeps each call's own order
    while any(pieces):
        i = data.draw(st.sampled_from([k for k, p in enumerate(pieces) if p]))
        deltas.append(Delta(tool_calls=(pieces[i].pop(0),)))
    c = completion(content, reasoning, expected, finish="tool_calls" if calls else "stop")
    chunks = run(enc, deltas, c)
    final = sdk_final(chunks)
    events = sdk_events(chunks)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    by_type = {}
    for item in final.output:
        by_type.setdefault(item.type, []).append(item)
    assert [i.summary[0].text for i in by_type.get("reasoning", [])] == ([reasoning] if reasoning else [])
    assert final.output_text == content
    got_calls = by_type.get("function_call", []) + by_type.get("custom_tool_call", [])
    got_calls.sort(key=lambda item: item.call_id)
    assert len(got_calls) == len(calls)
    for item, (name, value, _), call in zip(got_calls, calls, expected):
        if name == "exec":
            assert item.type == "custom_tool_call" and item.input == value
            streamed = "".join(e.delta for e in events
                               if e.type == "response.custom_tool_call_input.delta" and e.item_id == item.id)
            assert streamed == value
        else:
            assert item.type == "function_call" and item.arguments == call.arguments
            assert (item.namespace, item.name) == (("clock", "sleep") if name == "clock__sleep" else (None, name))
    # and the agent echoing this output back gives the backend the same assistant turn
    echoed = codec.to_chat(body(tools=tools, input=[{"role": "user", "content": "hi"}] +
                                [item.to_dict() for item in final.output]), GEN)
    turns = [m for m in echoed.chat["messages"] if m["role"] == "assistant"]
    if reasoning or content or calls:
        assert len(turns) == 1
        assert turns[0].get("reasoning_content", "") == reasoning
        assert (turns[0]["content"] or "") == content
        chat_calls = sorted(turns[0].get("tool_calls", []), key=lambda t: t["id"])
        assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in chat_calls] == \
            [(call.name, json.loads(call.arguments)) for call in expected]


# -- 6. non-streaming response and round trips ---------------------------------------------------------------------


def test_6_1_response_object_parses_as_the_sdks_response():
    enc = make_encoder(instructions="be brief", include=["reasoning.encrypted_content"],
                       tools=[{"type": "namespace", "name": "clock", "tools": [{"type": "custom", "name": "at"}]}])
    c = completion("Hi", "hmm", [ToolCall("call_9", "clock__at", '{"input": "noon"}')], finish="tool_calls")
    obj = enc.response(c)
    resp = sdk_client(orjson.dumps(obj), content_type=codec.JSON_CONTENT_TYPE).responses.create(model="gpt-5",
                                                                                                 input="hi")
    assert isinstance(resp, Response) and resp.status == "completed" and resp.output_text == "Hi"
    rs, msg, call = resp.output
    assert codec.decode_reasoning(rs.encrypted_content) == "hmm"
    assert (call.type, call.name, call.namespace, call.input, call.call_id) == ("custom_tool_call", "at", "clock",
                                                                                 "noon", "call_9")
    assert resp.usage.total_tokens == 18 and resp.instructions == "be brief"
    Response.model_validate(obj)  # strict pydantic validation, not just construction


def test_6_2_truncated_response_is_incomplete():
    obj = make_encoder().response(completion("abc", finish="length"))
    resp = Response.model_validate(obj)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[0].status == "incomplete"


def test_6_3_streamed_events_validate_strictly_against_the_sdk_union():
    enc = make_encoder(include=["reasoning.encrypted_content"], tools=[{"type": "custom", "name": "exec"},
                                                                       {"type": "function", "name": "sh"}])
    deltas = [Delta(reasoning="r"), Delta(text="t"),
              Delta(tool_calls=(ToolCallDelta(index=0, id="a", name="exec", arguments='{"input":"1"}'),)),
              Delta(tool_calls=(ToolCallDelta(index=1, id="b", name="sh", arguments="{}"),))]
    from pydantic import TypeAdapter
    adapter = TypeAdapter(ResponseStreamEvent)
    for raw in b"".join(run(enc, deltas, completion("t", "r", finish="tool_calls"))).split(b"\n\n")[:-1]:
        data = raw.split(b"data: ", 1)[1]
        adapter.validate_json(data)


def test_6_4_two_turn_namespaced_tool_round_trip():
    tools = [{"type": "namespace", "name": "clock", "tools": [{"type": "function", "name": "sleep",
                                                                "parameters": {"type": "object"}}]}]
    enc = make_encoder(tools=tools, include=["reasoning.encrypted_content"])
    c = completion("", "sleep a bit", [ToolCall("chatcmpl-tool-1", "clock__sleep", '{"ms": 5}')],
                   finish="tool_calls")
    final = sdk_final(run(enc, [Delta(reasoning="sleep a bit"), Delta(tool_calls=(
        ToolCallDelta(index=0, id="chatcmpl-tool-1", name="clock__sleep", arguments='{"ms": 5}'),))], c))
    call = final.output[1]
    assert (call.name, call.namespace, call.call_id) == ("sleep", "clock", "chatcmpl-tool-1")
    # Codex echoes reasoning without its text (only encrypted_content) and adds its own metadata
    history = [{"role": "user", "content": "sleep"}]
    for item in final.output:
        d = item.to_dict()
        if d["type"] == "reasoning":
            d["summary"] = []
        d["internal_chat_message_metadata_passthrough"] = {"turn_id": "t"}
        history.append(d)
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "slept"})
    p = codec.to_chat(body(tools=tools, input=history), GEN)
    assert p.chat["messages"][1] == {"role": "assistant", "content": None, "reasoning_content": "sleep a bit",
                                     "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function", "function": {
                                         "name": "clock__sleep", "arguments": '{"ms": 5}'}}]}
    assert p.chat["messages"][2] == {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "slept"}


def test_6_5_encrypted_reasoning_is_our_readable_encoding():
    blob = codec.encode_reasoning("x y")
    assert blob.startswith("polar:v1:") and base64.b64decode(blob[9:]) == b"x y"
    assert codec.decode_reasoning("gAAAA") is None


# -- 7. errors and token counts ------------------------------------------------------------------------------------


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
    got_status, payload = codec.error_response(GatewayError(kind, "why"))
    assert got_status == status
    err = json.loads(payload)["error"]
    assert err["code"] == code and err["message"] == "why" and "type" in err
    with pytest.raises(sdk_error) as exc:
        sdk_client(payload, status=status, content_type=codec.JSON_CONTENT_TYPE).responses.create(
            model="gpt-5", input="hi")
    assert exc.value.status_code == status and exc.value.code == code


def test_7_2_previous_response_id_is_a_400_with_a_clear_message():
    with pytest.raises(AgentInputError) as exc:
        plan_of(previous_response_id="resp_1")
    status, payload = codec.error_response(exc.value)
    assert status == 400 and b"stores no responses" in payload


def test_7_3_count_tokens_answer_shape():
    assert codec.count_tokens_response(42, Route(protocol="openai_responses", kind="count_tokens")) == {
        "object": "response.input_tokens", "input_tokens": 42}


# -- 6. remote compaction v2 (Codex 0.171: a compaction_trigger item, one compaction item back) -----------------


def test_6_1_a_compaction_trigger_asks_the_model_for_a_summary_without_tools():
    p = plan_of(input=[{"role": "user", "content": "fix it"},
                       {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "done"},
                       {"type": "compaction_trigger"}],
                tools=[{"type": "function", "name": "sh"}], stream=True)
    msgs = p.chat["messages"]
    assert msgs[-1] == {"role": "user", "content": codec.COMPACTION_PROMPT} and msgs[-2]["role"] == "tool"
    assert p.chat["tool_choice"] == "none" and [t["function"]["name"] for t in p.chat["tools"]] == ["sh"]
    assert p.extra["compaction"] and "compaction_request" in p.normalizations
    assert not plan_of().extra["compaction"]


def test_6_2_the_answer_is_exactly_one_compaction_item_holding_the_summary():
    enc = make_encoder(input=[{"role": "user", "content": "go"}, {"type": "compaction_trigger"}], stream=True)
    chunks = run(enc, [Delta(reasoning="hm"), Delta(text="The task: "), Delta(text="fix the parser.")],
                 completion("The task: fix the parser.", reasoning="hm"))
    events = [json.loads(block.split(b"data: ", 1)[1]) for block in b"".join(chunks).split(b"\n\n") if block]
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    (item,) = events[-1]["response"]["output"]
    assert item == events[3]["item"] and item["type"] == "compaction"
    assert codec.decode_reasoning(item["encrypted_content"]) == "The task: fix the parser."
    whole = codec.Encoder(enc.ctx).response(completion("The task: fix the parser.", finish="length"))
    assert whole["status"] == "completed" and [i["type"] for i in whole["output"]] == ["compaction"]


def test_6_3_a_compaction_item_comes_back_as_the_summary_and_someone_else_s_is_dropped():
    ours = codec.encode_reasoning("The task: fix the parser.")
    p = plan_of(input=[{"role": "user", "content": "fix it"}, {"type": "compaction", "encrypted_content": ours},
                       {"role": "user", "content": "go on"}])
    assert p.chat["messages"] == [{"role": "user", "content": "fix it"},
                                  {"role": "user", "content": codec.SUMMARY_PREFIX + "The task: fix the parser."},
                                  {"role": "user", "content": "go on"}]
    theirs = plan_of(input=[{"type": "compaction", "encrypted_content": "gAAAAB..."}, {"role": "user", "content": "x"}])
    assert theirs.chat["messages"] == [{"role": "user", "content": "x"}]
    assert "foreign_compaction_dropped" in theirs.normalizations
