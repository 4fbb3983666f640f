"""Google GenerateContent through the real proxy (mitmdump, real TLS) with the official `google-genai` SDK: JSON,
SSE and JSON-array streaming, two-turn tool use with the reasoning round trip, the router's JSON-schema side call,
bad input, backend failures, side endpoints, countTokens, the records, and replay of every captured Google body.

Scenarios: 1.x answers · 2.x tool round trips and constrained output · 3.x errors · 4.x routes · 5.x captures.
"""

from __future__ import annotations

import json
import os

import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from polar import records as rec
from tests.support.captures import CAPTURES_DIR, capture_files
from tests.support.records import assert_tokens_match, one_record
from tests.support.scripted_upstream import Reply
from tests.support.sdk import genai_sdk

pytestmark = pytest.mark.integration

BASE = "https://generativelanguage.googleapis.com"
SHELL = [types.Tool(function_declarations=[types.FunctionDeclaration(
    name="run_shell_command", description="Run a shell command",
    parameters=types.Schema(type="OBJECT", properties={"command": types.Schema(type="STRING")},
                            required=["command"]))])]
NO_AFC = types.AutomaticFunctionCallingConfig(disable=True)


def sdk(gateway, session: str | None = "gemini-session") -> genai.Client:
    return genai_sdk(gateway, session)


def sse_events(raw: bytes) -> list[types.GenerateContentResponse]:
    blocks = [b for b in raw.split(b"\r\n\r\n") if b.strip()]
    assert all(b.startswith(b"data: ") for b in blocks), raw[:200]
    return [types.GenerateContentResponse.model_validate_json(b[6:]) for b in blocks]


# -- 1. answers ----------------------------------------------------------------------------------------------------


@pytest.mark.reroute
def test_1_1_json_answer_carries_the_backends_usage_and_a_complete_record(gateway, upstream):
    upstream.script(Reply(text="Hello there."))
    resp = sdk(gateway).models.generate_content(
        model="gemini-2.5-pro", contents="hi", config=types.GenerateContentConfig(system_instruction="be brief"))
    assert isinstance(resp, types.GenerateContentResponse) and resp.text == "Hello there."
    assert resp.candidates[0].finish_reason == types.FinishReason.STOP
    truth = upstream.responses[-1]
    assert resp.usage_metadata.prompt_token_count == truth.usage["prompt_tokens"]
    assert resp.usage_metadata.candidates_token_count == truth.usage["completion_tokens"]
    r = one_record(gateway)
    assert (r["protocol"], r["session"], r["stream"], r["error"]) == ("google_generate", "gemini-session", False,
                                                                      None)
    assert (r["model_requested"], r["provider_stop_reason"], r["provider_status"]) == ("gemini-2.5-pro", "STOP",
                                                                                       200)
    assert_tokens_match(r, upstream)
    sent = upstream.chat_requests[-1].body
    assert sent["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


@pytest.mark.reroute
def test_1_2_sse_stream_shows_thoughts_and_text_and_ends_with_usage(gateway, upstream):
    upstream.script(Reply(text="Streaming works fine.", reasoning="Let me think."))
    chunks = list(sdk(gateway).models.generate_content_stream(
        model="gemini-2.5-flash", contents="hi",
        config=types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))))
    parts = [p for c in chunks for p in c.candidates[0].content.parts or []]
    truth = upstream.responses[-1]
    assert "".join(p.text for p in parts if p.thought) == truth.reasoning and "Let me think." in truth.reasoning
    assert "".join(p.text for p in parts if p.text and not p.thought) == truth.content  # vLLM's exact stream text
    assert truth.content.strip() == "Streaming works fine."
    assert len(chunks) > 2  # real streaming: more than one content event
    last = chunks[-1]
    assert last.candidates[0].finish_reason == types.FinishReason.STOP
    assert last.usage_metadata.total_token_count == truth.usage["prompt_tokens"] + truth.usage["completion_tokens"]
    r = one_record(gateway)
    assert r["stream"] is True and r["error"] is None
    assert_tokens_match(r, upstream)


def test_1_3_max_output_tokens_is_max_tokens(gateway, upstream):
    upstream.script(Reply(text="one two three four five six seven eight nine ten eleven twelve"))
    resp = sdk(gateway).models.generate_content(
        model="gemini-2.5-pro", contents="count", config=types.GenerateContentConfig(max_output_tokens=3))
    assert resp.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert resp.usage_metadata.candidates_token_count == 3
    assert upstream.chat_requests[-1].body["max_tokens"] == 3
    assert one_record(gateway)["provider_stop_reason"] == "MAX_TOKENS"


@pytest.mark.reroute
def test_1_4_stream_without_alt_sse_is_one_json_array(gateway, upstream):
    upstream.script(Reply(text="An array of answers."))
    with gateway.http_client(timeout=60) as http:
        got = http.post(f"{BASE}/v1beta/models/gemini-2.5-pro:streamGenerateContent",
                        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert got.status_code == 200, got.text
    elements = [types.GenerateContentResponse.model_validate(e) for e in json.loads(got.content)]
    assert "".join(e.text or "" for e in elements) == "An array of answers."
    assert elements[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert one_record(gateway)["stream"] is True


# -- 2. tool round trips and constrained output ---------------------------------------------------------------------


def test_2_1_two_turn_tool_use_restores_reasoning_and_exact_arguments(gateway, upstream):
    upstream.script(Reply(reasoning="I need a shell.", tool_calls=[("run_shell_command", {"command": "echo hi"})]),
                    Reply(text="It printed hi."))
    client = sdk(gateway)
    config = types.GenerateContentConfig(tools=SHELL, automatic_function_calling=NO_AFC,
                                         thinking_config=types.ThinkingConfig(include_thoughts=True))
    history = [types.Content(role="user", parts=[types.Part(text="run echo hi")])]
    chunks = list(client.models.generate_content_stream(model="gemini-2.5-pro", contents=history, config=config))
    calls = [p.function_call for c in chunks for p in c.candidates[0].content.parts or [] if p.function_call]
    assert [(c.name, c.args) for c in calls] == [("run_shell_command", {"command": "echo hi"})]
    truth = upstream.responses[-1]
    assert calls[0].id == truth.tool_calls[0]["id"]
    model_parts = [p for c in chunks for p in c.candidates[0].content.parts or [] if not p.thought]
    history += [types.Content(role="model", parts=model_parts),
                types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                    id=calls[0].id, name=calls[0].name, response={"output": "hi"}))])]
    final = client.models.generate_content(model="gemini-2.5-pro", contents=history, config=config)
    assert final.text == "It printed hi."

    first, second = (r.body for r in upstream.chat_requests[-2:])
    assert first["tools"][0]["function"]["parameters"]["type"] == "object"
    assistant, tool = second["messages"][-2:]
    assert assistant["reasoning_content"] == upstream.responses[-2].reasoning
    assert assistant["tool_calls"] == [{"id": truth.tool_calls[0]["id"], "type": "function", "function": {
        "name": "run_shell_command", "arguments": truth.tool_calls[0]["function"]["arguments"]}}]
    assert tool == {"role": "tool", "tool_call_id": truth.tool_calls[0]["id"], "content": '{"output": "hi"}'}
    records = gateway.records()
    assert [r["session"] for r in records] == ["gemini-session"] * 2
    assert "reasoning_dropped" not in records[1]["normalizations"]
    assert_tokens_match(records[1], upstream)


def test_2_2_forced_call_with_one_allowed_name_is_a_named_tool_choice(gateway, upstream):
    config = types.GenerateContentConfig(tools=SHELL, automatic_function_calling=NO_AFC, tool_config=types.ToolConfig(
        function_calling_config=types.FunctionCallingConfig(mode="ANY", allowed_function_names=["run_shell_command"])))
    resp = sdk(gateway).models.generate_content(model="gemini-2.5-pro", contents="list files", config=config)
    assert [c.name for c in resp.function_calls] == ["run_shell_command"]
    assert upstream.chat_requests[-1].body["tool_choice"] == {"type": "function",
                                                              "function": {"name": "run_shell_command"}}


def test_2_3_router_side_call_gets_json_for_its_upper_case_schema(gateway, upstream):
    schema = {"type": "OBJECT", "properties": {"reasoning": {"type": "STRING"},
                                               "model_choice": {"type": "STRING", "enum": ["flash", "pro"]}},
              "required": ["reasoning", "model_choice"]}
    resp = sdk(gateway).models.generate_content(
        model="gemini-2.5-flash-lite", contents="route this request",
        config=types.GenerateContentConfig(response_mime_type="application/json", response_json_schema=schema))
    doc = json.loads(resp.text)
    assert set(doc) >= {"reasoning", "model_choice"} and doc["model_choice"] in ("flash", "pro")
    fmt = upstream.chat_requests[-1].body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["type"] == "object"
    assert "schema_types_lowercased" in one_record(gateway)["normalizations"]


# -- 3. errors -----------------------------------------------------------------------------------------------------


def test_3_1_bad_input_is_googles_400_and_recorded(gateway, upstream):
    with pytest.raises(genai_errors.ClientError) as exc:
        sdk(gateway).models.generate_content(model="gemini-2.5-pro", contents="hi",
                                             config=types.GenerateContentConfig(candidate_count=2))
    assert (exc.value.code, exc.value.status) == (400, "INVALID_ARGUMENT") and "candidateCount" in exc.value.message
    r = one_record(gateway)
    assert r["error"]["stage"] == "agent_input" and r["provider_status"] == 400
    assert upstream.chat_requests == []


@pytest.mark.parametrize(("fault", "code", "status"), [("status:503", 503, "UNAVAILABLE"),
                                                       ("status:429", 429, "RESOURCE_EXHAUSTED")])
def test_3_2_backend_failures_before_headers_are_googles_errors(gateway, upstream, fault, code, status):
    upstream.script(Reply(fault=fault))
    with pytest.raises(genai_errors.APIError) as exc:
        sdk(gateway).models.generate_content(model="gemini-2.5-pro", contents="hi")
    assert (exc.value.code, exc.value.status) == (code, status)
    assert one_record(gateway)["error"] is not None


def test_3_3_mid_stream_loss_is_a_final_error_event(gateway, upstream):
    upstream.script(Reply(text="This answer will be cut off somewhere in the middle of it.",
                          fault="disconnect_after:3"))
    got = []
    with pytest.raises(genai_errors.ServerError) as exc:
        for chunk in sdk(gateway).models.generate_content_stream(model="gemini-2.5-pro", contents="hi"):
            got.append(chunk.text)
    assert got and (exc.value.code, exc.value.status) == (503, "UNAVAILABLE")
    assert one_record(gateway)["error"]["stage"] == "backend_stream"


# -- 4. routes -----------------------------------------------------------------------------------------------------


def test_4_1_side_endpoints_are_fast_google_404s(gateway, upstream):
    with gateway.http_client() as http:
        for method, path in (("GET", "/v1beta/models"), ("GET", "/v1beta/models/gemini-2.5-pro"),
                             ("POST", "/v1beta/models/gemini-2.5-pro:embedContent")):
            got = http.request(method, f"{BASE}{path}", json={} if method == "POST" else None)
            assert got.status_code == 404 and got.json()["error"]["status"] == "NOT_FOUND", path
    assert gateway.records() == [] and upstream.chat_requests == []


def test_4_2_count_tokens_answers_from_tokenize_without_a_record(gateway, upstream):
    got = sdk(gateway).models.count_tokens(model="gemini-2.5-pro", contents="how many tokens is this?")
    assert got.total_tokens > 0
    assert gateway.records() == [] and upstream.chat_requests == []


@pytest.mark.reroute
def test_4_3_key_query_parameter_never_reaches_the_record(gateway, upstream):
    upstream.script(Reply(text="ok"))
    with gateway.http_client() as http:
        got = http.post(f"{BASE}/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key=AIzaSECRET",
                        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert got.status_code == 200 and sse_events(got.content)[-1].candidates[0].finish_reason
    r = one_record(gateway)
    assert r["path"].endswith(":streamGenerateContent?alt=sse") and b"AIzaSECRET" not in rec.pack(r)


# -- 5. captured Gemini CLI bodies ---------------------------------------------------------------------------------


def _google_captures() -> list[str]:
    folders = sorted(os.listdir(CAPTURES_DIR)) if os.path.isdir(CAPTURES_DIR) else []
    return [path for folder in folders for path in capture_files(folder)
            if json.load(open(path)).get("host") == "generativelanguage.googleapis.com"]


@pytest.mark.parametrize("path", _google_captures(), ids=lambda p: "/".join(p.split(os.sep)[-2:]))
def test_5_1_every_captured_google_body_is_answered_with_valid_events(gateway, upstream, path):
    with open(path) as fh:
        cap = json.load(fh)
    query = "&".join(f"{k}={v}" for k, v in cap.get("query") or [])
    with gateway.http_client(timeout=60) as http:
        got = http.post(f"https://{cap['host']}{cap['path']}" + (f"?{query}" if query else ""), json=cap["body"])
    assert got.status_code == 200, got.text
    events = sse_events(got.content)
    assert events[-1].candidates[0].finish_reason is not None and events[-1].usage_metadata.total_token_count
    r = one_record(gateway)
    assert r["error"] is None and r["protocol"] == "google_generate"
    assert_tokens_match(r, upstream)
