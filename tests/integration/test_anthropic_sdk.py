"""Anthropic Messages through the real proxy (mitmdump, real TLS) with the official `anthropic` SDK: JSON, real
incremental SSE, count_tokens, Claude Code's side call, two-turn tool use with the thinking round trip, bad input,
backend failures before and after headers, side endpoints, sessions, the records, and every captured Claude Code body.

Scenarios: 1.x answers · 2.x tool round trips · 3.x errors · 4.x routes and sessions · 5.x captures.
"""

from __future__ import annotations

import json
import os
import threading

import anthropic
import httpx2  # the anthropic SDK (2.x) runs on httpx2 and rejects httpx clients
import msgpack
import pytest
from anthropic.types import Message

from tests.support.captures import capture_files
from tests.support.records import assert_tokens_match, one_record
from tests.support.scripted_upstream import Reply
from tests.support.sdk import anthropic_sdk

pytestmark = pytest.mark.integration

API = "https://api.anthropic.com"
KEY = "sk-ant-secret-test-key"
BASH = [{"name": "Bash", "description": "Run a shell command",
         "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
# Backend-only fields an Anthropic client must never see.
BACKEND_ONLY = (b"token_ids", b"prompt_token_ids", b"system_fingerprint", b"chatcmpl", b"polar-tiny")


def http2(gateway, session: str | None) -> httpx2.Client:
    return gateway.sdk_http_client(session, timeout=60)


def sdk(gateway, session: str | None = "claude-session", **kw) -> anthropic.Anthropic:
    return anthropic_sdk(gateway, session, api_key=KEY, **kw)


def assert_no_secret(record: dict) -> None:
    assert KEY.encode() not in msgpack.packb(record, use_bin_type=True)


def events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# -- 1. answers ----------------------------------------------------------------------------------------------------


@pytest.mark.reroute
def test_1_1_json_answer_is_a_message_with_the_backends_usage(gateway, upstream):
    upstream.script(Reply(text="Hello there."))
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
              {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    raw = sdk(gateway).messages.with_raw_response.create(model="claude-test", max_tokens=200, system=system,
                                                         messages=user("hi"),
                                                         extra_body={"temperature": 0.3, "top_k": 20})
    msg = raw.parse()
    Message.model_validate_json(raw.http_response.content)
    for needle in BACKEND_ONLY:
        assert needle not in raw.http_response.content
    truth = upstream.responses[-1]
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == truth.content
    assert (msg.model, msg.stop_reason, msg.id[:4]) == ("claude-test", "end_turn", "msg_")
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (truth.usage["prompt_tokens"],
                                                                 truth.usage["completion_tokens"])
    r = one_record(gateway)
    assert (r["protocol"], r["session"], r["stream"], r["error"]) == ("anthropic_messages", "claude-session",
                                                                      False, None)
    assert (r["model_requested"], r["provider_stop_reason"], r["provider_status"]) == ("claude-test", "end_turn", 200)
    assert "removed_billing_header" in r["normalizations"]
    assert_tokens_match(r, upstream)
    assert_no_secret(r)
    sent = upstream.chat_requests[-1].body
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert (sent["temperature"], sent["top_k"], sent["max_tokens"], sent["stream"]) == (0.3, 20, 200, True)


@pytest.mark.reroute
def test_1_2_stream_is_the_full_event_sequence_with_real_input_tokens(gateway, upstream):
    upstream.script(Reply(text="Streaming works fine.", reasoning="Let me think."))
    with http2(gateway, "claude-session") as http:
        got = http.post(f"{API}/v1/messages?beta=true", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                        json={"model": "claude-test", "max_tokens": 300, "stream": True, "messages": user("hi"),
                              "thinking": {"type": "enabled", "budget_tokens": 100}})
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/event-stream")
    evs = events(got.content)
    truth = upstream.responses[-1]
    names = [e for e, _ in evs]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert evs[0][1]["message"]["usage"]["input_tokens"] == truth.usage["prompt_tokens"]
    blocks = [d["content_block"]["type"] for e, d in evs if e == "content_block_start"]
    assert blocks == ["thinking", "text"]
    deltas = [d["delta"]["type"] for e, d in evs if e == "content_block_delta"]
    assert deltas.index("signature_delta") < deltas.index("text_delta")
    assert "".join(d["delta"].get("thinking", "") for e, d in evs if e == "content_block_delta") == truth.reasoning
    assert "".join(d["delta"].get("text", "") for e, d in evs if e == "content_block_delta") == truth.content
    assert evs[-2][1]["usage"]["output_tokens"] == truth.usage["completion_tokens"]
    for needle in BACKEND_ONLY:
        assert needle not in got.content
    r = one_record(gateway)
    assert r["stream"] is True and r["provider_stop_reason"] == "end_turn"
    assert_tokens_match(r, upstream)


def test_1_3_sdk_stream_is_incremental(gateway, upstream):
    upstream.script(Reply(text="First words, then the rest of the answer.", gate=True))
    released_by_timer = threading.Event()

    def fallback():
        released_by_timer.set()
        upstream.release()

    timer = threading.Timer(8.0, fallback)
    timer.start()
    try:
        with sdk(gateway).messages.stream(model="claude-test", max_tokens=100, messages=user("hi")) as stream:
            texts = stream.text_stream
            first = next(texts)
            # The first words reached the agent while the backend was still holding the rest.
            assert not released_by_timer.is_set() and first
            upstream.release()
            rest = "".join(texts)
            final = stream.get_final_message()
    finally:
        timer.cancel()
    assert first + rest == upstream.responses[-1].content == final.content[0].text


def test_1_4_stop_sequence_and_max_tokens(gateway, upstream):
    upstream.script(Reply(text="one two three four five"), Reply(text="one two three four five six seven eight"))
    client = sdk(gateway)
    stopped = client.messages.create(model="m", max_tokens=100, messages=user("count"), stop_sequences=["three"])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "three")
    assert "three" not in stopped.content[0].text
    cut = client.messages.create(model="m", max_tokens=3, messages=user("count"))
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert [r.body["stop"] for r in upstream.chat_requests[:1]] == [["three"]]
    assert upstream.chat_requests[1].body["max_tokens"] == 3
    assert [r["provider_stop_reason"] for r in gateway.records()] == ["stop_sequence", "max_tokens"]


def test_1_5_count_tokens_is_answered_from_tokenize_and_not_recorded(gateway, upstream):
    upstream.script(Reply(text="ok"))
    client = sdk(gateway)
    kw = {"model": "claude-test", "system": "Be brief.", "messages": user("how many tokens is this?")}
    counted = client.messages.count_tokens(**kw)
    assert upstream.chat_requests == [] and gateway.records() == []
    made = client.messages.create(max_tokens=50, **kw)
    assert counted.input_tokens == made.usage.input_tokens == upstream.responses[-1].usage["prompt_tokens"]


def test_1_6_claude_code_title_side_call_gets_schema_json(gateway, upstream):
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"],
              "additionalProperties": False}
    with http2(gateway, "claude-session") as http:
        got = http.post(f"{API}/v1/messages?beta=true", json={
            "model": "claude-haiku", "max_tokens": 512, "tools": [], "thinking": {"type": "disabled"},
            "messages": user("title this session"), "metadata": {"user_id": "{}"},
            "output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}})
    assert got.status_code == 200, got.text
    msg = Message.model_validate_json(got.content)
    assert isinstance(json.loads(msg.content[0].text)["title"], str)
    sent = upstream.chat_requests[-1].body
    assert "tools" not in sent and sent["response_format"]["json_schema"]["schema"] == schema
    r = one_record(gateway)
    assert {"ignored:output_config.effort", "ignored:metadata"} <= set(r["normalizations"])


# -- 2. tool round trips -------------------------------------------------------------------------------------------


def test_2_1_two_turn_tool_use_restores_thinking_and_arguments(gateway, upstream):
    upstream.script(Reply(reasoning="I need a shell.", tool_calls=[("Bash", {"command": "echo hi"})]),
                    Reply(text="It printed hi."))
    client = sdk(gateway, session=None, default_headers={"X-Claude-Code-Session-Id": "cc-session-1"})
    history: list = user("run echo hi")
    with client.messages.stream(model="claude-test", max_tokens=1000, tools=BASH, messages=history,
                                thinking={"type": "enabled", "budget_tokens": 500}) as stream:
        first = stream.get_final_message()
    truth = upstream.responses[-1]
    assert first.stop_reason == "tool_use"
    # Whatever text the model put between its reasoning and the call (vLLM passes it as content) stays visible.
    assert [b.type for b in first.content] == ["thinking"] + ["text"] * bool(truth.content) + ["tool_use"]
    thinking, call = first.content[0], first.content[-1]
    assert thinking.thinking == truth.reasoning and thinking.signature
    assert (call.id, call.name, call.input) == (truth.tool_calls[0]["id"], "Bash", {"command": "echo hi"})
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hi"},
                                             {"type": "text", "text": "<system-reminder>ok</system-reminder>"}]}]
    second = client.messages.create(model="claude-test", max_tokens=1000, tools=BASH, messages=history,
                                    thinking={"type": "enabled", "budget_tokens": 500})
    assert second.content[-1].text == upstream.responses[-1].content and second.stop_reason == "end_turn"

    sent = upstream.chat_requests[-1].body
    assistant, tool, reminder = sent["messages"][-3:]
    assert assistant["reasoning_content"] == truth.reasoning
    assert assistant["content"] == (truth.content or None)
    assert assistant["tool_calls"] == [{"id": call.id, "type": "function", "function": {
        "name": "Bash", "arguments": truth.tool_calls[0]["function"]["arguments"]}}]
    assert tool == {"role": "tool", "tool_call_id": call.id, "content": "hi"}
    assert reminder == {"role": "user", "content": "<system-reminder>ok</system-reminder>"}
    records = gateway.records()
    assert [(r["session"], r["session_source"]) for r in records] == [
        ("cc-session-1", "harness:x-claude-code-session-id")] * 2
    assert "reasoning_dropped" not in records[1]["normalizations"]
    for i, r in enumerate(records):
        assert_tokens_match(r, upstream, i)
        assert_no_secret(r)


def test_2_2_named_tool_choice_ends_as_tool_use(gateway, upstream):
    resp = sdk(gateway).messages.create(model="m", max_tokens=500, tools=BASH, messages=user("run ls"),
                                        tool_choice={"type": "tool", "name": "Bash"})
    assert resp.stop_reason == "tool_use" and resp.content[-1].type == "tool_use"
    assert resp.content[-1].name == "Bash" and isinstance(resp.content[-1].input, dict)
    assert upstream.chat_requests[-1].body["tool_choice"] == {"type": "function", "function": {"name": "Bash"}}
    assert one_record(gateway)["provider_stop_reason"] == "tool_use"


# -- 3. errors -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "needle"), [
    ({"model": "m", "max_tokens": 5}, "messages"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
])
def test_3_1_bad_input_is_anthropics_400_and_recorded(gateway, upstream, body, needle):
    with http2(gateway, "claude-session") as http:
        got = http.post(f"{API}/v1/messages", json=body)
    assert got.status_code == 400
    err = got.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]
    r = one_record(gateway)
    assert r["error"]["stage"] == "agent_input" and r["provider_status"] == 400
    assert upstream.chat_requests == []


@pytest.mark.parametrize(("fault", "error", "status", "etype"), [
    ("status:503", anthropic.OverloadedError, 529, "overloaded_error"),
    ("status:429", anthropic.RateLimitError, 429, "rate_limit_error")])
def test_3_2_backend_failures_before_headers(gateway, upstream, fault, error, status, etype):
    upstream.script(Reply(fault=fault))
    with pytest.raises(error) as exc:
        with sdk(gateway).messages.stream(model="m", max_tokens=50, messages=user("hi")) as stream:
            stream.get_final_message()
    assert exc.value.status_code == status and exc.value.body["error"]["type"] == etype
    r = one_record(gateway)
    assert r["error"] is not None and r["provider_status"] == status


@pytest.mark.reroute
def test_3_3_mid_stream_loss_is_an_error_event(gateway, upstream):
    upstream.script(Reply(text="This answer will be cut off somewhere in the middle of it.",
                          fault="disconnect_after:3"),
                    Reply(text="This one too, but read by the SDK.", fault="disconnect_after:3"))
    with http2(gateway, "claude-session") as http:
        got = http.post(f"{API}/v1/messages", json={"model": "m", "max_tokens": 100, "stream": True,
                                                     "messages": user("hi")})
    assert got.status_code == 200
    evs = events(got.content)
    assert evs[0][0] == "message_start" and "message_stop" not in [e for e, _ in evs]
    assert evs[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error",
                                                            "message": evs[-1][1]["error"]["message"]}})
    with pytest.raises(anthropic.APIStatusError):
        with sdk(gateway).messages.stream(model="m", max_tokens=100, messages=user("hi")) as stream:
            stream.get_final_message()
    records = gateway.records()
    assert len(records) == 2 and all(r["error"]["stage"] == "backend_stream" for r in records)


def test_3_4_backend_down_then_the_proxy_keeps_serving(gateway, upstream):
    upstream.script(Reply(fault="garbage"), Reply(text="Back again."))
    client = sdk(gateway)
    with pytest.raises(anthropic.APIStatusError) as exc:
        client.messages.create(model="m", max_tokens=50, messages=user("hi"))
    assert exc.value.status_code == 529
    assert client.messages.create(model="m", max_tokens=50, messages=user("hi")).content[0].text == "Back again."


# -- 4. routes and sessions ----------------------------------------------------------------------------------------


@pytest.mark.reroute
def test_4_1_side_endpoints_are_answered_by_the_gateway_anthropic_404s(gateway, upstream):
    """What "fast" meant: the gateway answers these itself (no upstream call to wait on, no record)."""
    side = (("GET", "/v1/models"), ("POST", "/api/event_logging/batch"), ("GET", "/v1/messages"))
    with http2(gateway, "claude-session") as http:
        for method, path in side:
            got = http.request(method, f"{API}{path}", headers={"x-api-key": KEY})
            assert got.status_code == 404, path
            assert got.json()["type"] == "error" and got.json()["error"]["type"] == "not_found_error"
    assert gateway.records() == [] and upstream.chat_requests == []
    side_paths = {path for _, path in side if path != "/v1/models"}  # the gateway asks /v1/models itself
    assert [r.path for r in upstream.requests if r.path.split("?")[0] in side_paths] == []


def test_4_2_session_from_metadata_user_id_when_no_header(gateway, upstream):
    upstream.script(Reply(text="ok"))
    user_id = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "meta-session"})
    sdk(gateway, session=None).messages.create(model="m", max_tokens=20, messages=user("hi"),
                                               metadata={"user_id": user_id})
    r = one_record(gateway)
    assert (r["session"], r["session_source"]) == ("meta-session", "harness:metadata.user_id")


# -- 5. captured Claude Code bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", capture_files("claude-code"), ids=os.path.basename)
def test_5_1_every_captured_claude_code_body_is_answered(gateway, upstream, path):
    with open(path) as fh:
        cap = json.load(fh)
    keep = ("accept", "content-type", "user-agent", "anthropic-version", "anthropic-beta", "x-claude-code-session-id")
    headers = {k: v for k, v in cap["headers"] if k.lower() in keep}
    query = "&".join(f"{k}={v}" for k, v in cap.get("query") or ())
    with http2(gateway, None) as http:
        got = http.post(f"https://{cap['host']}{cap['path']}" + (f"?{query}" if query else ""), json=cap["body"],
                        headers=headers)
    assert got.status_code == 200, got.text
    evs = events(got.content)
    assert [e for e, _ in evs][-2:] == ["message_delta", "message_stop"]
    assert evs[0][1]["message"]["usage"]["input_tokens"] == upstream.responses[-1].usage["prompt_tokens"]
    r = one_record(gateway)
    assert r["error"] is None and r["protocol"] == "anthropic_messages"
    assert (r["session"], r["session_source"]) == (dict((k.lower(), v) for k, v in cap["headers"])[
        "x-claude-code-session-id"], "harness:x-claude-code-session-id")
    assert "removed_billing_header" in r["normalizations"]
    sent = upstream.chat_requests[-1].body
    assert not any("x-anthropic-billing-header" in json.dumps(m) for m in sent["messages"])
    assert_tokens_match(r, upstream)
