"""OpenAI Responses through the real proxy (mitmdump, real TLS) with the official `openai` SDK: JSON, streaming,
two-turn tool use with a namespaced tool and a freeform custom tool, bad input, backend failures, side endpoints,
session keys, the records, and replay of every captured Codex body.

Scenarios: 1.x answers · 2.x tool round trips · 3.x errors · 4.x routes and sessions · 5.x captures.
"""

from __future__ import annotations

import json
import os

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from polar.addon.codecs import openai_responses as codec
from tests.support.captures import capture_files
from tests.support.records import assert_tokens_match, one_record
from tests.support.scripted_upstream import Reply
from tests.support.sdk import OPENAI_V1, openai_sdk

pytestmark = pytest.mark.integration

EVENTS = TypeAdapter(ResponseStreamEvent)
CLOCK = [{"type": "namespace", "name": "clock", "description": "time",
          "tools": [{"type": "function", "name": "sleep", "description": "sleep a while",
                     "parameters": {"type": "object", "properties": {"ms": {"type": "integer"}},
                                    "required": ["ms"]}}]}]
EXEC = [{"type": "namespace", "name": "functions",
         "tools": [{"type": "custom", "name": "exec", "description": "run JavaScript"}]}]


def sdk(gateway, session: str | None = "resp-session", base_url: str = OPENAI_V1) -> openai.OpenAI:
    return openai_sdk(gateway, session, base_url=base_url)


# -- 1. answers ----------------------------------------------------------------------------------------------------


@pytest.mark.reroute
def test_1_1_json_answer_is_a_response_with_the_backends_usage(gateway, upstream):
    upstream.script(Reply(text="Hello there."))
    resp = sdk(gateway).responses.create(model="gpt-5", instructions="be brief", input="hi", store=False)
    assert isinstance(resp, Response) and resp.status == "completed" and resp.output_text == "Hello there."
    truth = upstream.responses[-1]
    assert resp.usage.input_tokens == truth.usage["prompt_tokens"]
    assert resp.usage.output_tokens == truth.usage["completion_tokens"]
    r = one_record(gateway)
    assert (r["protocol"], r["session"], r["stream"], r["error"]) == ("openai_responses", "resp-session", False,
                                                                      None)
    assert r["provider_stop_reason"] == "completed" and r["provider_status"] == 200
    assert_tokens_match(r, upstream)
    sent = upstream.chat_requests[-1].body
    assert sent["messages"][:2] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


@pytest.mark.reroute
def test_1_2_stream_is_the_full_event_sequence_and_accumulates_in_the_sdk(gateway, upstream):
    upstream.script(Reply(text="Streaming works fine.", reasoning="Let me think."))
    client = sdk(gateway)
    with client.responses.stream(model="gpt-5", input="hi", reasoning={"effort": "low", "summary": "auto"},
                                 include=["reasoning.encrypted_content"]) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[:2] == ["response.created", "response.in_progress"]
    for needed in ("response.reasoning_summary_text.delta", "response.content_part.added",
                   "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                   "response.output_item.done"):
        assert needed in types
    assert types[-1] == "response.completed"
    reasoning, message = final.output
    truth = upstream.responses[-1]
    assert codec.decode_reasoning(reasoning.encrypted_content) == truth.reasoning  # exactly the backend's text
    assert truth.reasoning.strip() == "Let me think."
    assert message.content[0].text == truth.content and truth.content.strip() == "Streaming works fine."
    r = one_record(gateway)
    assert r["stream"] is True and r["t_first_byte"] is not None
    assert_tokens_match(r, upstream)
    assert final.usage.output_tokens == len(upstream.responses[-1].completion_ids)


def test_1_3_max_output_tokens_ends_incomplete(gateway, upstream):
    upstream.script(Reply(text="one two three four five six seven eight nine ten"))
    resp = sdk(gateway).responses.create(model="gpt-5", input="count", max_output_tokens=3)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3
    assert one_record(gateway)["provider_stop_reason"] == "incomplete:max_output_tokens"


# -- 2. tool round trips -------------------------------------------------------------------------------------------


def test_2_1_two_turn_namespaced_tool_call(gateway, upstream):
    upstream.script(Reply(reasoning="I will sleep.", tool_calls=[("clock__sleep", {"ms": 5})]),
                    Reply(text="Slept."))
    client = sdk(gateway)
    history: list = [{"role": "user", "content": "sleep 5 ms"}]
    with client.responses.stream(model="gpt-5", input=history, tools=CLOCK,
                                 include=["reasoning.encrypted_content"], store=False) as stream:
        first = stream.get_final_response()
    call = next(item for item in first.output if item.type == "function_call")
    assert (call.name, call.namespace, json.loads(call.arguments)) == ("sleep", "clock", {"ms": 5})
    upstream_call = upstream.responses[-1].tool_calls[0]
    assert call.call_id == upstream_call["id"]
    # Codex-style echo: reasoning keeps only encrypted_content
    for item in first.output:
        d = item.to_dict()
        if d["type"] == "reasoning":
            d["summary"] = []
        history.append(d)
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "slept 5 ms"})
    second = client.responses.create(model="gpt-5", input=history, tools=CLOCK,
                                     include=["reasoning.encrypted_content"], store=False)
    assert second.output_text == "Slept."
    sent = upstream.chat_requests[-1].body
    assistant = sent["messages"][1]
    assert assistant["reasoning_content"] == upstream.responses[0].reasoning
    assert assistant["tool_calls"][0]["function"]["name"] == "clock__sleep"
    assert assistant["tool_calls"][0]["id"] == call.call_id
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": call.call_id, "content": "slept 5 ms"}
    assert [t["function"]["name"] for t in sent["tools"]] == ["clock__sleep"]
    records = gateway.records()
    assert len(records) == 2 and all(r["protocol"] == "openai_responses" for r in records)
    assert "namespaced_tools:clock" in records[1]["normalizations"]


def test_2_2_custom_tool_streams_its_input_and_echoes_as_a_function_call(gateway, upstream):
    code = 'const r = await tools.exec_command({cmd: "echo hi"});\ntext(r.output);'
    upstream.script(Reply(reasoning="Run it.", tool_calls=[("exec", {"input": code})]), Reply(text="It said hi."))
    client = sdk(gateway)
    stream = client.responses.create(model="gpt-5", input="say hi via exec", tools=EXEC, stream=True)
    events = list(stream)
    streamed = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert streamed == code
    done = next(e for e in events if e.type == "response.output_item.done" and e.item.type == "custom_tool_call")
    assert (done.item.name, done.item.input, done.item.namespace) == ("exec", code, None)
    history = [{"role": "user", "content": "say hi via exec"}]
    history += [e.item.to_dict() for e in events if e.type == "response.output_item.done"]
    history.append({"type": "custom_tool_call_output", "call_id": done.item.call_id,
                    "output": [{"type": "input_text", "text": "hi\n"}]})
    second = client.responses.create(model="gpt-5", input=history, tools=EXEC)
    assert second.output_text == "It said hi."
    sent = upstream.chat_requests[-1].body
    call = sent["messages"][1]["tool_calls"][0]
    assert call["function"]["name"] == "exec" and json.loads(call["function"]["arguments"]) == {"input": code}
    assert sent["messages"][2]["content"] == "hi\n"


# -- 3. errors -----------------------------------------------------------------------------------------------------


def test_3_1_previous_response_id_is_a_clear_400_and_recorded(gateway, upstream):
    with pytest.raises(openai.BadRequestError) as exc:
        sdk(gateway).responses.create(model="gpt-5", input="hi", previous_response_id="resp_123")
    assert exc.value.status_code == 400 and "previous_response_id" in exc.value.message
    r = one_record(gateway)
    assert r["error"]["stage"] == "agent_input" and r["provider_status"] == 400
    assert upstream.chat_requests == []


def test_3_2_backend_503_is_the_providers_503(gateway, upstream):
    upstream.script(Reply(fault="status:503"))
    with pytest.raises(openai.InternalServerError) as exc:
        sdk(gateway).responses.create(model="gpt-5", input="hi")
    assert exc.value.status_code == 503
    assert one_record(gateway)["error"] is not None


def test_3_3_mid_stream_loss_is_response_failed(gateway, upstream):
    upstream.script(Reply(text="This answer will be cut off somewhere in the middle of it.",
                          fault="disconnect_after:3"))
    events = list(sdk(gateway).responses.create(model="gpt-5", input="hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.failed"
    assert events[-1].response.status == "failed" and events[-1].response.error.code == "server_error"
    r = one_record(gateway)
    assert r["error"]["stage"] == "backend_stream"


# -- 4. routes and sessions ----------------------------------------------------------------------------------------


@pytest.mark.reroute
def test_4_1_websocket_upgrade_is_426_and_side_endpoints_are_fast_404s(gateway, upstream):
    with gateway.http_client() as http:
        ws = http.get("https://api.openai.com/v1/responses",
                      headers={"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
        assert ws.status_code == 426 and ws.json()["error"]["code"] == "upgrade_required"
        models = http.get("https://chatgpt.com/backend-api/codex/models?client_version=0.171.0")
        assert models.status_code == 404 and "error" in models.json()
    assert gateway.records() == [] and upstream.chat_requests == []


def test_4_2_chatgpt_codex_path_and_codex_session_header(gateway, upstream):
    upstream.script(Reply(text="Via chatgpt.com."))
    client = sdk(gateway, session=None, base_url="https://chatgpt.com/backend-api/codex")
    resp = client.responses.create(model="gpt-5", input="hi", prompt_cache_key="cache-key",
                                   extra_headers={"session-id": "codex-thread-1"})
    assert resp.output_text == "Via chatgpt.com."
    r = one_record(gateway)
    assert (r["session"], r["session_source"], r["host"]) == ("codex-thread-1", "harness:session-id",
                                                             "chatgpt.com")


def test_4_3_token_count_endpoint(gateway, upstream):
    with gateway.http_client() as http:
        got = http.post("https://api.openai.com/v1/responses/input_tokens", json={"model": "gpt-5", "input": "hi"})
    assert got.status_code == 200
    doc = got.json()
    assert doc["object"] == "response.input_tokens" and doc["input_tokens"] > 0


# -- 5. captured Codex bodies --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", capture_files("codex"), ids=os.path.basename)
def test_5_1_every_captured_codex_body_is_answered_with_valid_events(gateway, upstream, path):
    with open(path) as fh:
        cap = json.load(fh)
    headers = {k: v for k, v in cap["headers"] if k.lower() in ("session-id", "accept", "content-type")}
    with gateway.http_client(session=None, timeout=60) as http:
        got = http.post(f"https://{cap['host']}{cap['path']}", json=cap["body"], headers=headers)
    assert got.status_code == 200, got.text
    events = [EVENTS.validate_json(block.split(b"data: ", 1)[1])
              for block in got.content.split(b"\n\n") if block.strip()]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    r = one_record(gateway)
    assert r["error"] is None and r["session_source"] == "harness:session-id"
    assert_tokens_match(r, upstream)
