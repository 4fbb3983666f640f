"""OpenAI Chat Completions through the real proxy (mitmdump, real TLS) with the official `openai` SDK, on
api.openai.com and DashScope's compatible mode (Qwen Code): JSON, streaming with and without the usage chunk, the
agent's own logprobs, two-turn and parallel tool use with the reasoning round trip, bad input, backend failures,
side endpoints, the Qwen session key, the records, and replay of every captured Qwen Code body.

Scenarios: 1.x answers · 2.x tool round trips · 3.x errors · 4.x routes and sessions · 5.x captures.
"""

from __future__ import annotations

import json
import os

import msgpack
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from polar import records as rec
from tests.support.captures import capture_files
from tests.support.records import assert_tokens_match, one_record
from tests.support.scripted_upstream import Reply
from tests.support.sdk import OPENAI_V1 as OPENAI
from tests.support.sdk import openai_sdk

pytestmark = pytest.mark.integration

DASHSCOPE = "https://dashscope.aliyuncs.com/compatible-mode/v1"
SHELL = [{"type": "function", "function": {
    "name": "run_shell_command", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
# Fields only the backend may see: an agent that did not ask must never receive any of them.
BACKEND_ONLY = (b"token_ids", b"prompt_token_ids", b"system_fingerprint", b"stop_reason", b'"logprobs":{',
                b"polar-tiny")


def sdk(gateway, session: str | None = "chat-session", base_url: str = OPENAI) -> openai.OpenAI:
    return openai_sdk(gateway, session, base_url=base_url)


def sse_chunks(raw: bytes) -> tuple[list[ChatCompletionChunk], bytes]:
    """Strictly validated chunks, and the last event's data (b"[DONE]" on a clean end)."""
    blocks = [b for b in raw.split(b"\n\n") if b.strip()]
    assert all(b.startswith(b"data: ") for b in blocks), raw[:200]
    datas = [b[6:] for b in blocks]
    chunks = [ChatCompletionChunk.model_validate_json(d) for d in datas if d != b"[DONE]" and b'"error"' not in d]
    return chunks, datas[-1]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# -- 1. answers ----------------------------------------------------------------------------------------------------


@pytest.mark.reroute
def test_1_1_json_answer_is_a_chat_completion_with_the_backends_usage(gateway, upstream):
    upstream.script(Reply(text="Hello there."))
    raw = sdk(gateway).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "developer", "content": "be brief"}, *user("hi")], temperature=0.3)
    resp = raw.parse()
    assert isinstance(resp, ChatCompletion) and resp.choices[0].message.content == "Hello there."
    ChatCompletion.model_validate_json(raw.http_response.content)
    for needle in BACKEND_ONLY:
        assert needle not in raw.http_response.content
    truth = upstream.responses[-1]
    assert resp.model == "gpt-4o" and resp.choices[0].finish_reason == "stop"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (truth.usage["prompt_tokens"],
                                                                        truth.usage["completion_tokens"])
    r = one_record(gateway)
    assert (r["protocol"], r["session"], r["stream"], r["error"]) == ("openai_chat", "chat-session", False, None)
    assert (r["model_requested"], r["provider_stop_reason"], r["provider_status"]) == ("gpt-4o", "stop", 200)
    assert "developer_as_system" in r["normalizations"]
    assert_tokens_match(r, upstream)
    sent = upstream.chat_requests[-1].body
    assert sent["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert sent["temperature"] == 0.3 and sent["stream"] is True


def test_1_2_dashscope_stream_role_reasoning_content_finish_usage_done(gateway, upstream):
    upstream.script(Reply(text="Streaming works fine.", reasoning="Let me think."))
    client = sdk(gateway, base_url=DASHSCOPE)
    with client.chat.completions.stream(model="qwen3.5-plus", messages=user("hi"),
                                        stream_options={"include_usage": True}) as stream:
        final = stream.get_final_completion()
    truth = upstream.responses[-1]
    msg = final.choices[0].message
    assert msg.content == truth.content and truth.content.strip() == "Streaming works fine."
    assert getattr(msg, "reasoning_content", None) == truth.reasoning and "Let me think." in truth.reasoning
    assert final.choices[0].finish_reason == "stop"
    assert final.usage.prompt_tokens == truth.usage["prompt_tokens"]
    assert final.usage.completion_tokens == truth.usage["completion_tokens"]
    r = one_record(gateway)
    assert (r["protocol"], r["host"], r["stream"]) == ("openai_chat", "dashscope.aliyuncs.com", True)
    assert_tokens_match(r, upstream)


@pytest.mark.reroute
def test_1_3_raw_stream_shape_and_no_usage_chunk_unless_asked(gateway, upstream):
    upstream.script(Reply(text="No usage for you."), Reply(text="Usage for you."))
    with gateway.http_client(timeout=60) as http:
        plain = http.post(f"{OPENAI}/chat/completions", json={"model": "gpt-4o", "messages": user("hi"),
                                                               "stream": True})
        asked = http.post(f"{OPENAI}/chat/completions", json={"model": "gpt-4o", "messages": user("hi"),
                                                               "stream": True,
                                                               "stream_options": {"include_usage": True}})
    assert plain.headers["content-type"].startswith("text/event-stream")
    chunks, last = sse_chunks(plain.content)
    assert last == b"[DONE]"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None and c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == upstream.responses[0].content
    for needle in BACKEND_ONLY:
        assert needle not in plain.content
    chunks, last = sse_chunks(asked.content)
    assert last == b"[DONE]" and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == upstream.responses[1].usage["completion_tokens"]
    assert len(gateway.records()) == 2


def test_1_4_the_agents_own_logprobs_are_honoured(gateway, upstream):
    upstream.script(Reply(text="Numbers, please."))
    chunks = list(sdk(gateway).chat.completions.create(model="gpt-4o", messages=user("hi"), stream=True,
                                                       logprobs=True, top_logprobs=2))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    truth = upstream.responses[-1]
    assert len(entries) == len(truth.completion_ids)
    assert [e.logprob for e in entries] == pytest.approx(truth.logprobs)
    assert all(len(e.top_logprobs) <= 2 for e in entries)
    assert upstream.chat_requests[-1].body["top_logprobs"] == 2
    resp = sdk(gateway).chat.completions.create(model="gpt-4o", messages=user("hi"), logprobs=True)
    assert len(resp.choices[0].logprobs.content) == len(upstream.responses[-1].completion_ids)


def test_1_5_max_completion_tokens_is_max_tokens_and_ends_with_length(gateway, upstream):
    upstream.script(Reply(text="one two three four five six seven eight nine ten eleven twelve"))
    resp = sdk(gateway).chat.completions.create(model="gpt-4o", messages=user("count"), max_completion_tokens=3)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 3
    assert upstream.chat_requests[-1].body["max_tokens"] == 3
    r = one_record(gateway)
    assert r["provider_stop_reason"] == "length" and "max_completion_tokens_as_max_tokens" in r["normalizations"]


# -- 2. tool round trips -------------------------------------------------------------------------------------------


def test_2_1_qwen_style_two_turn_tool_use_restores_reasoning_and_exact_arguments(gateway, upstream):
    upstream.script(Reply(reasoning="I need a shell.", tool_calls=[("run_shell_command", {"command": "echo hi"})]),
                    Reply(text="It printed hi."))
    client = sdk(gateway, session=None, base_url=DASHSCOPE)
    meta = {"metadata": {"sessionId": "qwen-session-1", "promptId": "p1"}}
    history: list = [{"role": "system", "content": [{"type": "text", "text": "You are a coding agent.",
                                                     "cache_control": {"type": "ephemeral"}}]},
                     {"role": "user", "content": [{"type": "text", "text": "run echo hi"}]}]
    with client.chat.completions.stream(model="qwen3.5-plus", messages=history, tools=SHELL, max_tokens=8000,
                                        stream_options={"include_usage": True}, extra_body=meta) as stream:
        first = stream.get_final_completion()
    msg = first.choices[0].message
    truth = upstream.responses[-1]
    assert first.choices[0].finish_reason == "tool_calls"
    call = msg.tool_calls[0]
    assert (call.id, call.function.name) == (truth.tool_calls[0]["id"], "run_shell_command")
    assert call.function.arguments == truth.tool_calls[0]["function"]["arguments"]
    assert json.loads(call.function.arguments) == {"command": "echo hi"}
    history.append({"role": "assistant", "content": None, "reasoning_content": msg.reasoning_content,
                    "tool_calls": [call.model_dump(exclude_none=True)]})
    history.append({"role": "tool", "tool_call_id": call.id,
                    "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]})
    second = client.chat.completions.create(model="qwen3.5-plus", messages=history, tools=SHELL, stream=True,
                                            stream_options={"include_usage": True}, extra_body=meta)
    assert "".join(c.choices[0].delta.content or "" for c in second if c.choices) == upstream.responses[-1].content

    sent = upstream.chat_requests[-1].body
    assistant, tool = sent["messages"][-2:]
    assert assistant["reasoning_content"] == upstream.responses[0].reasoning
    assert assistant["tool_calls"] == [{"id": call.id, "type": "function", "function": {
        "name": "run_shell_command", "arguments": truth.tool_calls[0]["function"]["arguments"]}}]
    assert tool == {"role": "tool", "tool_call_id": call.id, "content": "hi"}
    assert "cache_control" not in json.dumps(sent)
    records = gateway.records()
    assert [(r["session"], r["session_source"]) for r in records] == [
        ("qwen-session-1", "harness:metadata.sessionId")] * 2
    assert {"tool_content_flattened", "removed_cache_control", "dropped_metadata"} <= set(records[1]["normalizations"])
    assert_tokens_match(records[1], upstream)


def test_2_2_parallel_tool_calls_and_a_required_choice(gateway, upstream):
    # With reasoning first: vLLM's stream runs the tool parser only once reasoning has ended (docs/field-notes.md).
    upstream.script(Reply(reasoning="Two commands.", tool_calls=[("run_shell_command", {"command": "ls"}),
                                      ("run_shell_command", {"command": "pwd"})]))
    resp = sdk(gateway).chat.completions.create(model="gpt-4o", messages=user("ls and pwd"), tools=SHELL,
                                                tool_choice="required", parallel_tool_calls=True)
    calls = resp.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == [{"command": "ls"}, {"command": "pwd"}]
    assert [c.id for c in calls] == [t["id"] for t in upstream.responses[-1].tool_calls]
    assert len({c.id for c in calls}) == 2 and resp.choices[0].finish_reason == "tool_calls"
    assert upstream.chat_requests[-1].body["tool_choice"] == "required"


# -- 3. errors -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "needle"), [({"n": 2}, "'n' > 1"),
                                               ({"tool_choice": {"type": "function", "function": {"name": "x"}}},
                                                "not in 'tools'")])
def test_3_1_bad_input_is_openais_400_and_recorded(gateway, upstream, extra, needle):
    with pytest.raises(openai.BadRequestError) as exc:
        sdk(gateway).chat.completions.create(model="gpt-4o", messages=user("hi"), tools=SHELL, **extra)
    assert exc.value.status_code == 400 and needle in exc.value.message
    assert exc.value.type == "invalid_request_error"
    r = one_record(gateway)
    assert r["error"]["stage"] == "agent_input" and r["provider_status"] == 400
    assert upstream.chat_requests == []


@pytest.mark.parametrize(("fault", "error", "status"), [("status:503", openai.InternalServerError, 503),
                                                        ("status:429", openai.RateLimitError, 429)])
def test_3_2_backend_failures_before_headers_are_openais_errors(gateway, upstream, fault, error, status):
    upstream.script(Reply(fault=fault))
    with pytest.raises(error) as exc:
        sdk(gateway).chat.completions.create(model="gpt-4o", messages=user("hi"), stream=True)
    assert exc.value.status_code == status
    r = one_record(gateway)
    assert r["error"] is not None and r["provider_status"] == status


@pytest.mark.reroute
def test_3_3_mid_stream_loss_is_an_error_event_without_done(gateway, upstream):
    upstream.script(Reply(text="This answer will be cut off somewhere in the middle of it.",
                          fault="disconnect_after:3"),
                    Reply(text="This one too, but read by the SDK.", fault="disconnect_after:3"))
    with gateway.http_client(timeout=60) as http:
        got = http.post(f"{OPENAI}/chat/completions", json={"model": "gpt-4o", "messages": user("hi"),
                                                             "stream": True})
    assert got.status_code == 200
    chunks, last = sse_chunks(got.content)
    assert b"[DONE]" not in got.content and json.loads(last)["error"]["type"] == "server_error"
    assert chunks[0].choices[0].delta.role == "assistant"
    with pytest.raises(openai.APIError):
        list(sdk(gateway).chat.completions.create(model="gpt-4o", messages=user("hi"), stream=True))
    records = gateway.records()
    assert len(records) == 2 and all(r["error"]["stage"] == "backend_stream" for r in records)


# -- 4. routes and sessions ----------------------------------------------------------------------------------------


def test_4_1_side_endpoints_are_fast_openai_shaped_404s(gateway, upstream):
    with gateway.http_client() as http:
        for url in (f"{OPENAI}/models", f"{DASHSCOPE}/models",
                    "https://dashscope-intl.aliyuncs.com/api/v1/services/aigc/text-generation/generation"):
            got = http.get(url)
            assert got.status_code == 404, url
            assert set(got.json()["error"]) == {"message", "type", "param", "code"}
    assert gateway.records() == [] and upstream.chat_requests == []


def test_4_2_dashscope_intl_with_the_proxy_user_as_session(gateway, upstream):
    upstream.script(Reply(text="Hi from intl."))
    client = sdk(gateway, session="user-session", base_url="https://dashscope-intl.aliyuncs.com/compatible-mode/v1")
    resp = client.chat.completions.create(model="qwen3.5-plus", messages=user("hi"),
                                          extra_body={"metadata": {"sessionId": "harness-session"}})
    assert resp.choices[0].message.content == "Hi from intl."
    r = one_record(gateway)
    assert (r["session"], r["host"]) == ("user-session", "dashscope-intl.aliyuncs.com")


# -- 5. captured Qwen Code bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", capture_files("qwen-code"), ids=os.path.basename)
def test_5_1_every_captured_qwen_body_is_answered_with_valid_chunks(gateway, upstream, path):
    with open(path) as fh:
        cap = json.load(fh)
    headers = {k: v for k, v in cap["headers"] if k.lower() in ("accept", "content-type", "user-agent")}
    with gateway.http_client(session=None, timeout=60) as http:
        got = http.post(f"https://{cap['host']}{cap['path']}", json=cap["body"], headers=headers)
    assert got.status_code == 200, got.text
    chunks, last = sse_chunks(got.content)
    assert last == b"[DONE]" and chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # Qwen Code asks include_usage
    assert chunks[-1].usage.prompt_tokens == upstream.responses[-1].usage["prompt_tokens"]
    r = one_record(gateway)
    assert r["error"] is None and r["protocol"] == "openai_chat"
    assert (r["session"], r["session_source"]) == (cap["body"]["metadata"]["sessionId"],
                                                   "harness:metadata.sessionId")
    assert_tokens_match(r, upstream)


def test_3_1_prompt_ids_stay_the_backends_bytes_and_the_state_counts_the_path(gateway, upstream):
    before = gateway.admin_state()["prompt_ids"]
    upstream.script(Reply(text="one"), Reply(text="two"))
    client = sdk(gateway)
    client.chat.completions.create(model="gpt-4o", messages=user("hi"))
    list(client.chat.completions.create(model="gpt-4o", messages=user("again"), stream=True))
    records = gateway.records()
    assert len(records) == 2
    for r, truth in zip(records, upstream.responses[-2:]):
        # vLLM's compact array, stored as its ASCII digits (an ExtType), reading back as the same ids
        assert isinstance(r["prompt_token_ids"], msgpack.ExtType) and r["prompt_token_ids"].code == rec.ASCII_IDS
        assert r["prompt_token_ids"].data == ",".join(map(str, truth.prompt_token_ids)).encode()
        assert rec.unpack_ids(r["prompt_token_ids"]) == truth.prompt_token_ids
        assert r["usage"]["prompt_tokens"] == len(truth.prompt_token_ids)
    after = gateway.admin_state()["prompt_ids"]
    assert (after["fast"] - before["fast"], after["parsed"] - before["parsed"]) == (2, 0)
