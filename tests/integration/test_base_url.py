"""Base-URL mode through the real proxy (mitmdump): the official SDKs with their base URL set to the gateway's own
address and no proxy or CA variable at all, against the records of the same conversations through HTTPS_PROXY; the
path-prefix session and its precedence; the rules that keep the mode to this machine (Host, Origin, JSON bodies, no
CORS); unknown addresses in the protocol's error shape. Every test also counts `served.base_url` in /admin/state, so
a client that ignored its base URL (and reached us some other way) cannot pass.

Scenarios: 1.x the four protocols, records equal to the proxy path's · 2.x sessions · 3.x refusals.
"""

from __future__ import annotations

import base64
import json
import socket
import threading

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types as gtypes

from polar import records as rec
from polar.addon.codecs.anthropic import SIGNATURE_MARKER
from tests.support.scripted_upstream import Reply
from tests.support.sdk import anthropic_sdk, genai_sdk, openai_sdk

pytestmark = [pytest.mark.integration, pytest.mark.reroute]

PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "SSL_CERT_FILE",
              "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "SSL_CERT_DIR", "CODEX_CA_CERTIFICATE")
# Fields that differ between the two ways in by construction; everything else must be equal. The scripted
# upstream's logprobs follow its request count, so they are checked against what it sent instead.
DIFFERENT = {"id", "t_start", "t_first_byte", "t_end", "conn_id", "connect", "session_source", "request_headers",
             "completion_logprobs"}
SHELL_TOOL = {"name": "run_shell", "description": "Run a shell command",
              "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                             "required": ["command"]}}


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch):
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


def base(gateway, family: str, session: str | None = None) -> str:
    prefix = f"/s/{session}" if session else ""
    return f"http://127.0.0.1:{gateway.port}{prefix}/{family}"


def served(gateway) -> dict:
    return gateway.admin_state()["served"]


def made_ids(records: list[dict], upstream) -> list[str]:
    """What differs by construction inside bodies: the upstream's tool-call ids (vLLM draws a new one per call) and
    the ids the gateway makes from a record's id (response ids, Anthropic's thinking signature), which the agent
    echoes in its next request."""
    out = [c["id"] for r in upstream.responses for c in r.tool_calls]
    for r in records:
        hexid = r["id"].replace("-", "")
        out += [base64.b64encode(SIGNATURE_MARKER + hexid.encode()).decode(), r["id"], hexid]
    return out


def canonical(value, call_ids: list[str]) -> str:
    """A field as text with the ids of `made_ids` numbered."""
    text = json.dumps(value, sort_keys=True, default=lambda b: b.decode("latin-1"))
    for i, call_id in enumerate(call_ids):
        text = text.replace(call_id, f"<call {i}>")
    return text


def same_but_the_way_in(via_proxy: tuple[list[dict], list[str]], via_base: tuple[list[dict], list[str]]) -> None:
    (proxied, ids_a), (based, ids_b) = via_proxy, via_base
    assert len(proxied) == len(based) > 0 and len(ids_a) == len(ids_b) > 0
    for a, b in zip(proxied, based):
        assert (a["connect"], b["connect"]) == ("proxy", "base_url")
        assert a["v"] == b["v"] == rec.VERSION
        for name in rec.FIELDS:
            if name not in DIFFERENT:
                assert canonical(a[name], ids_a) == canonical(b[name], ids_b), name


def conversation(gateway, upstream, run, session: str) -> list[dict]:
    """The records of one scripted two-turn tool conversation run by `run()`; their token data is the upstream's."""
    upstream.reset()
    upstream.script(Reply(reasoning="A shell lists them.", tool_calls=[("run_shell", {"command": "ls"})]),
                    Reply(text="Done: two files."))
    gateway.mark()
    run()
    records = gateway.records()
    assert [r["session"] for r in records] == [session] * 2, [r.get("error") for r in records]
    for record, truth in zip(records, upstream.responses):
        assert rec.token_ids(record, "completion_token_ids") == truth.completion_ids
        assert rec.unpack_floats(record["completion_logprobs"]) == pytest.approx(truth.logprobs, abs=1e-6)
    return records, made_ids(records, upstream)


# -- 1. the four protocols --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_1_1_anthropic_messages_by_base_url_records_what_the_proxy_path_records(gateway, upstream, stream):
    tools = [{"name": SHELL_TOOL["name"], "description": SHELL_TOOL["description"],
              "input_schema": SHELL_TOOL["parameters"]}]

    def run(client):
        def go():
            msgs = [{"role": "user", "content": "list the files"}]
            kw = dict(model="claude-sonnet-4-5", max_tokens=512, tools=tools, messages=msgs)
            if stream:
                with client.messages.stream(**kw) as s:
                    first = s.get_final_message()
            else:
                first = client.messages.create(**kw)
            use = next((b for b in first.content if b.type == "tool_use"), None)
            assert use is not None, (upstream.chat_requests[-1].body.get("tools"), upstream.chat_requests[-1].body.get("tool_choice"), first.content[0].text)
            assert use.input == {"command": "ls"}
            msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a b"}]}]
            second = client.messages.create(**{**kw, "messages": msgs})
            assert second.content[0].text == "Done: two files."
        return go

    before = served(gateway)["base_url"]
    via_proxy = conversation(gateway, upstream, run(anthropic_sdk(gateway, "conv-a")), "conv-a")
    direct = anthropic.Anthropic(api_key="sk-test", max_retries=0, base_url=base(gateway, "anthropic", "conv-a"))
    via_base = conversation(gateway, upstream, run(direct), "conv-a")
    same_but_the_way_in(via_proxy, via_base)
    assert [r["session_source"] for r in via_base[0]] == ["path", "path"]
    assert all(r["host"] == "api.anthropic.com" and r["path"] == "/v1/messages" for r in via_base[0])
    assert served(gateway)["base_url"] == before + 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_1_2_openai_chat_by_base_url_records_what_the_proxy_path_records(gateway, upstream, stream):
    tools = [{"type": "function", "function": SHELL_TOOL}]

    def run(client):
        def go():
            msgs = [{"role": "user", "content": "list the files"}]
            if stream:
                chunks = list(client.chat.completions.create(model="gpt-4o", messages=msgs, tools=tools,
                                                             stream=True))
                call = next(c.delta.tool_calls[0] for ch in chunks for c in ch.choices if c.delta.tool_calls)
                call_id, args = call.id, "".join(
                    c.delta.tool_calls[0].function.arguments or "" for ch in chunks for c in ch.choices
                    if c.delta.tool_calls)
            else:
                first = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=tools)
                call_id, args = first.choices[0].message.tool_calls[0].id, \
                    first.choices[0].message.tool_calls[0].function.arguments
            assert json.loads(args) == {"command": "ls"}
            msgs += [{"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": "run_shell", "arguments": args}}]}, {"role": "tool", "tool_call_id": call_id, "content": "a b"}]
            second = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=tools)
            assert second.choices[0].message.content == "Done: two files."
        return go

    before = served(gateway)["base_url"]
    via_proxy = conversation(gateway, upstream, run(openai_sdk(gateway, "conv-c")), "conv-c")
    direct = openai.OpenAI(api_key="sk-test", max_retries=0, base_url=base(gateway, "openai/v1", "conv-c"))
    via_base = conversation(gateway, upstream, run(direct), "conv-c")
    same_but_the_way_in(via_proxy, via_base)
    assert all(r["host"] == "api.openai.com" and r["path"] == "/v1/chat/completions" for r in via_base[0])
    assert served(gateway)["base_url"] == before + 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_1_3_openai_responses_by_base_url_records_what_the_proxy_path_records(gateway, upstream, stream):
    tools = [{"type": "function", **SHELL_TOOL}]

    def run(client):
        def go():
            items = [{"role": "user", "content": "list the files"}]
            if stream:
                with client.responses.stream(model="gpt-5", input=items, tools=tools) as s:
                    first = s.get_final_response()
            else:
                first = client.responses.create(model="gpt-5", input=items, tools=tools)
            call = next(o for o in first.output if o.type == "function_call")
            assert json.loads(call.arguments) == {"command": "ls"}
            items += [o.model_dump(exclude_none=True) for o in first.output]
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a b"})
            second = client.responses.create(model="gpt-5", input=items, tools=tools)
            assert second.output_text == "Done: two files."
        return go

    before = served(gateway)["base_url"]
    via_proxy = conversation(gateway, upstream, run(openai_sdk(gateway, "conv-r")), "conv-r")
    direct = openai.OpenAI(api_key="sk-test", max_retries=0, base_url=base(gateway, "openai/v1", "conv-r"))
    via_base = conversation(gateway, upstream, run(direct), "conv-r")
    same_but_the_way_in(via_proxy, via_base)
    assert all(r["protocol"] == "openai_responses" and r["path"] == "/v1/responses" for r in via_base[0])
    assert served(gateway)["base_url"] == before + 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_1_4_google_generate_content_by_base_url_records_what_the_proxy_path_records(gateway, upstream, stream):
    tool = gtypes.Tool(function_declarations=[gtypes.FunctionDeclaration(
        name=SHELL_TOOL["name"], description=SHELL_TOOL["description"],
        parameters_json_schema=SHELL_TOOL["parameters"])])
    config = gtypes.GenerateContentConfig(tools=[tool], automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(
        disable=True))

    def run(client):
        def go():
            contents = [gtypes.Content(role="user", parts=[gtypes.Part(text="list the files")])]
            if stream:
                parts = [p for ch in client.models.generate_content_stream(
                    model="gemini-2.5-flash", contents=contents, config=config) for p in ch.candidates[0].content.parts]
            else:
                parts = client.models.generate_content(model="gemini-2.5-flash", contents=contents,
                                                       config=config).candidates[0].content.parts
            call = next(p.function_call for p in parts if p.function_call)
            assert call.args == {"command": "ls"}
            contents += [gtypes.Content(role="model", parts=parts), gtypes.Content(role="user", parts=[
                gtypes.Part.from_function_response(name=call.name, response={"output": "a b"})])]
            second = client.models.generate_content(model="gemini-2.5-flash", contents=contents, config=config)
            assert second.text == "Done: two files."
        return go

    before = served(gateway)["base_url"]
    via_proxy = conversation(gateway, upstream, run(genai_sdk(gateway, "conv-g")), "conv-g")
    direct = genai.Client(api_key="AIza-test", http_options=gtypes.HttpOptions(
        base_url=base(gateway, "google", "conv-g")))
    via_base = conversation(gateway, upstream, run(direct), "conv-g")
    same_but_the_way_in(via_proxy, via_base)
    assert all(r["host"] == "generativelanguage.googleapis.com" for r in via_base[0])
    assert served(gateway)["base_url"] == before + 2


# -- 2. sessions ------------------------------------------------------------------------------------------------


def post(gateway, path: str, body: dict | bytes, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"content-type": "application/json", "authorization": "Bearer sk-test", **(headers or {})}
    with httpx.Client(trust_env=False, timeout=60) as client:
        return client.post(f"http://127.0.0.1:{gateway.port}{path}", content=content, headers=hdrs)


CHAT = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def test_2_1_sessions_come_from_proxy_credentials_then_the_path_then_the_header(gateway, upstream):
    upstream.script(Reply(text="one"), Reply(text="two"), Reply(text="three"), Reply(text="four"))
    assert post(gateway, "/s/path%2Fsession%20%C3%A9/openai/v1/chat/completions", CHAT,
                {"x-polar-session": "header-session"}).status_code == 200
    assert post(gateway, "/openai/v1/chat/completions", CHAT, {"x-polar-session": "header-session"}).status_code == 200
    # What the sandbox relay stamps: proxy credentials name the session, and a path naming the same one agrees.
    auth = {"proxy-authorization": "Basic " + base64.b64encode(b"sample-7:x").decode()}
    assert post(gateway, "/s/sample-7/openai/v1/chat/completions", CHAT, auth).status_code == 200
    assert post(gateway, "/openai/v1/chat/completions", CHAT, {**auth, "x-polar-session": "h"}).status_code == 200
    got = [(r["session"], r["session_source"], r["connect"]) for r in gateway.records()]
    assert got == [("path/session é", "path", "base_url"), ("header-session", "x-polar-session", "base_url"),
                   ("sample-7", "proxy_auth", "base_url"), ("sample-7", "proxy_auth", "base_url")]
    assert all("sk-test" not in json.dumps(r["request_headers"]) for r in gateway.records())


def test_2_2_a_path_naming_another_session_than_the_credentials_gets_the_protocols_400(gateway, upstream):
    seen = len(upstream.requests)  # the gateway's own start-up calls, when it starts in this test
    auth = {"proxy-authorization": "Basic " + base64.b64encode(b"sample-7:x").decode()}
    before = served(gateway)
    resp = post(gateway, "/s/sample-8/anthropic/v1/messages",
                {"model": "c", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}, auth)
    assert resp.status_code == 400
    assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "invalid_request_error"
    assert "sample-8" in resp.json()["error"]["message"] and "sample-7" in resp.json()["error"]["message"]
    assert gateway.records() == [] and upstream.requests[seen:] == []
    assert served(gateway)["base_url_refused"] == before["base_url_refused"] + 1
    assert "base-URL request" in gateway.log_text()


# -- 3. refusals ------------------------------------------------------------------------------------------------


class FakeProvider:
    """A listener standing in for a real provider on this machine: it counts every connection it gets."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


def test_3_1_only_this_machine_origin_host_and_non_json_bodies_are_refused_without_cors(gateway, upstream):
    seen = len(upstream.requests)  # the gateway's own start-up calls, when it starts in this test
    provider = FakeProvider()
    before = served(gateway)["base_url_refused"]
    cases = [
        ("/openai/v1/chat/completions", {"origin": "https://evil.example"}, 403, "Origin"),
        ("/openai/v1/chat/completions", {"host": f"evil.example:{gateway.port}"}, 403, "listen address"),
        # a Host naming another server on this machine: refused, never forwarded there
        ("/anthropic/v1/messages", {"host": f"127.0.0.1:{provider.port}"}, 403, "listen address"),
        ("/google/v1beta/models/g:generateContent", {"content-type": "text/plain"}, 400, "content-type"),
    ]
    for path, headers, status, words in cases:
        resp = post(gateway, path, CHAT, headers)
        assert resp.status_code == status, (path, headers, resp.text)
        assert words in resp.text
        assert not any(k.lower().startswith("access-control-") for k in resp.headers)
    assert resp.json()["error"]["status"] == "INVALID_ARGUMENT"  # the Google family's own shape
    assert gateway.records() == [] and upstream.requests[seen:] == []
    assert served(gateway)["base_url_refused"] == before + len(cases)
    assert provider.accepted == 0
    provider.sock.close()


def test_3_2_an_unknown_address_or_endpoint_gets_the_protocols_404_and_nothing_is_forwarded(gateway, upstream):
    seen = len(upstream.requests)  # the gateway's own start-up calls, when it starts in this test
    resp = post(gateway, "/mistral/v1/chat/completions", CHAT)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert "/anthropic, /openai/v1 or /google" in resp.json()["error"]["message"]
    resp = post(gateway, "/anthropic/v1/nothing-here", CHAT)
    assert resp.status_code == 404 and resp.json()["type"] == "error"
    assert gateway.records() == [] and upstream.requests[seen:] == []
