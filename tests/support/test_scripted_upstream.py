"""The scripted upstream speaks vLLM 0.32's wire format (local sockets only).

1.x  side endpoints: /v1/models, /version, /health, /tokenize (identical to the chat prompt ids)
2.x  non-streaming chat: ids, logprobs, usage, reasoning, tool calls
3.x  streaming chat: chunk shapes, token ids and logprobs per chunk, reasoning and tool-call deltas, usage, [DONE]
4.x  finish: EOS, length, stop string, stop token, exact ids
5.x  vLLM's 400/404 errors (context length, empty tools, unknown model)
6.x  faults
7.x  gate
8.x  default replies (forced tool choice, JSON schema)
9.x  round trip: echoing the answer gives a prompt that extends prompt + completion ids
10.x vLLM's reasoning/tool parser interplay in streams
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support.chat_template import ROOT, Tokenizer
from tests.support.scripted_upstream import Reply, ScriptedUpstream, minimal_json

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                   "required": ["command", "timeout"]}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
USER = [{"role": "user", "content": "list the files"}]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer()


@pytest.fixture(scope="module")
def server(tok):
    with ScriptedUpstream(tok) as up:
        yield up


@pytest.fixture
def up(server):
    server.reset()
    yield server
    server.reset()


def body(stream=False, **kw):
    b = {"model": "polar-tiny", "messages": USER, "logprobs": True, "top_logprobs": 0, "return_token_ids": True,
         "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    b.update(kw)
    return b


def post(up, **kw):
    return httpx.post(up.base_url + "/chat/completions", json=body(**kw), timeout=10)


def events(up, **kw) -> list:
    """All SSE data payloads of a streamed chat call (parsed JSON, or the raw string)."""
    out = []
    with httpx.stream("POST", up.base_url + "/chat/completions", json=body(stream=True, **kw), timeout=10) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def merge(evs: list) -> dict:
    """Accumulate a stream the way a client does."""
    acc = {"content": "", "reasoning": "", "ids": [], "logprobs": [], "calls": {}, "finish": None}
    for e in evs[1:]:
        if e == "[DONE]" or not e["choices"]:
            continue
        c = e["choices"][0]
        d = c["delta"]
        acc["content"] += d.get("content") or ""
        acc["reasoning"] += d.get("reasoning") or ""
        acc["ids"] += c.get("token_ids", [])
        acc["logprobs"] += [x["logprob"] for x in (c["logprobs"] or {}).get("content", [])]
        for tc in d.get("tool_calls", []):
            slot = acc["calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            slot["id"] = tc.get("id", slot["id"])
            slot["name"] = (tc.get("function") or {}).get("name", slot["name"])
            slot["arguments"] += (tc.get("function") or {}).get("arguments", "")
        acc["finish"] = c["finish_reason"] or acc["finish"]
    return acc


# ---- 1.x side endpoints ---------------------------------------------------------------------------------------

def test_1_1_models_version_health(up):
    models = httpx.get(up.base_url + "/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "polar-tiny"
    assert models["data"][0]["max_model_len"] == 65536
    assert httpx.get(up.root_url + "/version").json() == {"version": "0.32.0"}
    health = httpx.get(up.root_url + "/health")
    assert health.status_code == 200 and health.content == b""
    assert httpx.get(up.root_url + "/nope").status_code == 404


def test_1_2_tokenize_matches_chat_prompt(up, tok):
    t = httpx.post(up.root_url + "/tokenize", json={"model": "polar-tiny", "messages": USER, "tools": TOOLS}).json()
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] == 65536
    r = post(up, tools=TOOLS).json()
    assert r["prompt_token_ids"] == t["tokens"] == tok.apply_chat_template(USER, TOOLS)
    p = httpx.post(up.root_url + "/tokenize", json={"prompt": "hello <|im_end|>"}).json()
    assert p["tokens"] == tok.encode("hello <|im_end|>")


# ---- 2.x non-streaming ----------------------------------------------------------------------------------------

def test_2_1_text_reply(up, tok):
    up.script(Reply(text="Hello there."))
    r = post(up).json()
    c = r["choices"][0]
    assert r["object"] == "chat.completion" and r["system_fingerprint"].startswith("vllm-0.32.0")
    assert c["message"]["content"] == "Hello there." and c["message"]["tool_calls"] == []
    assert c["finish_reason"] == "stop" and c["stop_reason"] is None
    assert c["token_ids"] == tok.encode("Hello there.") + [tok.eos_id]
    assert [x["token"] for x in c["logprobs"]["content"]] == [tok.token_str(i) for i in c["token_ids"]]
    assert all(x["top_logprobs"] == [] and x["logprob"] < 0 for x in c["logprobs"]["content"])
    assert r["usage"]["prompt_tokens"] == len(r["prompt_token_ids"])
    assert r["usage"]["completion_tokens"] == len(c["token_ids"])
    rec = up.responses[-1]
    assert rec.completion_ids == c["token_ids"] and rec.prompt_token_ids == r["prompt_token_ids"]
    assert rec.logprobs == [x["logprob"] for x in c["logprobs"]["content"]]
    assert up.chat_requests[-1].body["messages"] == USER


def test_2_2_reasoning_and_tool_calls(up):
    up.script(Reply(text="Let me look.", reasoning="Need ls.", tool_calls=[("bash", {"command": "ls", "timeout": 5})]))
    c = post(up, tools=TOOLS).json()["choices"][0]
    m = c["message"]
    assert m["reasoning"] == "\nNeed ls.\n" and "reasoning_content" not in m
    assert m["content"] == "\n\nLet me look.\n"  # hermes keeps the text before <tool_call> as is
    assert c["finish_reason"] == "tool_calls"
    call = m["tool_calls"][0]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert call["function"] == {"name": "bash", "arguments": '{"command": "ls", "timeout": 5}'}


def test_2_3_top_logprobs_honoured(up):
    up.script(Reply(text="Hi"))
    c = post(up, top_logprobs=3).json()["choices"][0]
    for entry in c["logprobs"]["content"]:
        tops = entry["top_logprobs"]
        assert len(tops) == 3 and entry["token"] in [t["token"] for t in tops]
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)


def test_2_4_without_return_token_ids_or_logprobs(up):
    up.script(Reply(text="Hi"))
    r = post(up, return_token_ids=False, logprobs=False).json()
    assert r["prompt_token_ids"] is None and r["choices"][0]["token_ids"] is None
    assert r["choices"][0]["logprobs"] is None


# ---- 3.x streaming --------------------------------------------------------------------------------------------

def test_3_1_stream_shapes(up, tok):
    up.script(Reply(text="Hello there.", chunk_tokens=2))
    evs = events(up)
    first = evs[0]
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]
    assert first["prompt_token_ids"] == tok.apply_chat_template(USER)
    assert all("prompt_token_ids" not in e for e in evs[1:-1])
    assert evs[-1] == "[DONE]"
    usage = evs[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(up.responses[-1].completion_ids)
    body_chunks = evs[1:-2]
    assert all(len(e["choices"][0]["token_ids"]) <= 2 for e in body_chunks)
    assert all(len(e["choices"][0]["logprobs"]["content"]) == len(e["choices"][0]["token_ids"]) for e in body_chunks)
    assert body_chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "stop_reason" in body_chunks[-1]["choices"][0]
    acc = merge(evs)
    assert acc["content"] == "Hello there." and acc["ids"] == up.responses[-1].completion_ids
    assert acc["ids"][-1] == tok.eos_id and acc["logprobs"] == up.responses[-1].logprobs


def test_3_2_stream_reasoning_then_tool_calls(up):
    up.script(Reply(text="On it.", reasoning="Two calls.", tool_calls=[("bash", {"command": "ls", "timeout": 1}),
                                                                      ("read_file", {"path": "a.txt"})]))
    evs = events(up, tools=TOOLS)
    acc = merge(evs)
    rec = up.responses[-1]
    assert acc["reasoning"] == "\nTwo calls.\n" and acc["finish"] == "tool_calls"
    assert acc["content"].startswith("\n\nOn it.\n")
    assert [acc["calls"][i]["name"] for i in (0, 1)] == ["bash", "read_file"]
    assert [acc["calls"][i]["arguments"] for i in (0, 1)] == [c["function"]["arguments"] for c in rec.tool_calls]
    assert [acc["calls"][i]["id"] for i in (0, 1)] == [c["id"] for c in rec.tool_calls]
    heads = [tc for e in evs[1:-2] for tc in e["choices"][0]["delta"].get("tool_calls", []) if "id" in tc]
    assert heads[0]["type"] == "function" and heads[0]["function"] == {"name": "bash"}
    held = [e for e in evs[1:-2] if e["choices"][0]["delta"] == {}]
    assert held and all(e["choices"][0]["token_ids"] for e in held)  # parser holds text, ids still flow


def test_3_3_openai_sdk_accumulates_the_stream(up):
    up.script(Reply(reasoning="r", tool_calls=[("bash", {"command": "ls -la", "timeout": 3})]))
    client = openai.OpenAI(base_url=up.base_url, api_key="x", max_retries=0)
    stream = client.chat.completions.create(model="polar-tiny", messages=USER, tools=TOOLS, stream=True,
                                            stream_options={"include_usage": True})
    args, name, finish, usage = "", None, None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                name = tc.function.name or name
                args += tc.function.arguments or ""
    assert name == "bash" and json.loads(args) == {"command": "ls -la", "timeout": 3} and finish == "tool_calls"
    assert usage.completion_tokens == len(up.responses[-1].completion_ids)


# ---- 4.x finish -----------------------------------------------------------------------------------------------

def test_4_1_length_cuts_without_eos(up, tok):
    up.script(Reply(text="one two three four five six seven"))
    c = post(up, max_tokens=3).json()["choices"][0]
    assert c["finish_reason"] == "length" and len(c["token_ids"]) == 3 and tok.eos_id not in c["token_ids"]
    assert c["message"]["content"] == tok.decode(c["token_ids"])


def test_4_2_stop_string_cuts_text_keeps_ids(up, tok):
    up.script(Reply(text="alpha beta STOP gamma"))
    for stream in (False, True):
        up.script(Reply(text="alpha beta STOP gamma")) if stream else None
        if stream:
            acc = merge(events(up, stop=["STOP"]))
            text, ids, finish = acc["content"], acc["ids"], acc["finish"]
        else:
            c = post(up, stop="STOP").json()["choices"][0]
            text, ids, finish = c["message"]["content"], c["token_ids"], c["finish_reason"]
            assert c["stop_reason"] == "STOP"
        assert finish == "stop" and text == "alpha beta "
        assert "STOP" in tok.decode(ids) and tok.eos_id not in ids


def test_4_3_exact_ids(up, tok):
    ids = tok.encode("In") + tok.encode("side")  # a non-canonical split stays as sent
    up.script(Reply(ids=ids + [tok.eos_id]))
    c = post(up).json()["choices"][0]
    assert c["token_ids"] == ids + [tok.eos_id] and c["message"]["content"] == "Inside"
    up.script(Reply(ids=ids))  # no EOS: the turn ran out (length)
    assert post(up).json()["choices"][0]["finish_reason"] == "length"


def test_4_4_stop_token_ids(up, tok):
    nl = tok.encode("\n")[0]
    up.script(Reply(text="a\nb"))
    c = post(up, stop_token_ids=[nl]).json()["choices"][0]
    assert c["stop_reason"] == nl and c["token_ids"][-1] == nl and c["message"]["content"] == "a"


# ---- 5.x errors -----------------------------------------------------------------------------------------------

def test_5_1_context_errors_like_vllm():
    with ScriptedUpstream(max_model_len=64) as small:
        n = len(small.tokenizer.apply_chat_template(USER))
        r = post(small, max_tokens=64 - n + 1)
        assert r.status_code == 400
        assert r.json() == {"error": {
            "message": f"This model's maximum context length is 64 tokens. However, you requested {64 - n + 1} output "
                       f"tokens and your prompt contains at least {n} input tokens, for a total of at least 65 tokens. "
                       f"Please reduce the length of the input prompt or the number of requested output tokens. "
                       f"(parameter=input_tokens, value={n})",
            "type": "BadRequestError", "param": "input_tokens", "code": 400}}
        assert post(small, max_tokens=64 - n).status_code == 200
        long = [{"role": "user", "content": "word " * 200}]
        r = post(small, messages=long)
        assert r.status_code == 400 and "maximum context length is 64 tokens" in r.json()["error"]["message"]
        assert len(small.responses) == 1  # only the call that fit


@pytest.mark.parametrize("kw, status", [
    ({"tools": []}, 400),
    ({"tool_choice": "auto"}, 400),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400),
    ({"model": "other"}, 404),
])
def test_5_2_bad_requests(up, kw, status):
    r = post(up, **kw)
    assert r.status_code == status and r.json()["error"]["code"] == status


# ---- 6.x faults -----------------------------------------------------------------------------------------------

def test_6_1_status_faults(up):
    up.script(Reply(fault="status:503"), Reply(fault="status:500-nobody"), Reply(fault="status:429"))
    r = post(up)
    assert r.status_code == 503 and r.json()["error"]["code"] == 503
    r = post(up)
    assert r.status_code == 500 and r.content == b""
    assert post(up).status_code == 429
    assert post(up).status_code == 200  # back to defaults


def test_6_2_disconnect_mid_stream(up):
    up.script(Reply(text="a b c d e f", fault="disconnect_after:3"))
    got = []
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", up.base_url + "/chat/completions", json=body(stream=True), timeout=5) as r:
            for line in r.iter_lines():
                if line:
                    got.append(line)
    assert len(got) == 3


def test_6_3_garbage_and_missing_fields(up):
    up.script(Reply(fault="garbage"))
    evs = []
    with httpx.stream("POST", up.base_url + "/chat/completions", json=body(stream=True), timeout=5) as r:
        evs = [line for line in r.iter_lines() if line]
    with pytest.raises(ValueError):
        json.loads(evs[0][6:])
    up.script(Reply(text="x", fault=["no_token_ids", "no_logprobs"]))
    acc = merge(events(up))
    assert acc["ids"] == [] and acc["logprobs"] == [] and acc["content"] == "x"


def test_6_4_hang_and_slow_first_byte(up):
    up.script(Reply(fault="hang"))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(up.base_url + "/chat/completions", json=body(), timeout=0.5)
    up.script(Reply(fault="slow_first_byte:3"))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(up.base_url + "/chat/completions", json=body(), timeout=0.3)
    up.reset()  # frees the hanging handler
    assert post(up).status_code == 200


# ---- 7.x gate -------------------------------------------------------------------------------------------------

def test_7_1_gate_holds_the_stream_after_the_first_content_chunk(up):
    up.script(Reply(text="one two three", gate=True))
    with httpx.stream("POST", up.base_url + "/chat/completions", json=body(stream=True), timeout=10) as r:
        lines = r.iter_lines()
        first = [next(lines) for _ in range(2)]  # role chunk, blank line
        nxt = [next(lines) for _ in range(2)]    # first content chunk
        assert json.loads(first[0][6:])["choices"][0]["delta"]["role"] == "assistant"
        assert json.loads(nxt[0][6:])["choices"][0]["delta"] == {"content": "one"}
        assert up.wait_for_gate(5)
        assert up.responses[-1].completion_ids  # the server is parked, not finished
        up.release()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"


# ---- 8.x default replies --------------------------------------------------------------------------------------

def test_8_1_required_and_named_tool_choice(up):
    c = post(up, tools=TOOLS, tool_choice="required").json()["choices"][0]
    assert c["finish_reason"] == "tool_calls"
    assert c["message"]["tool_calls"][0]["function"] == {"name": "bash",
                                                         "arguments": '{"command": "ls", "timeout": 1}'}
    named = {"type": "function", "function": {"name": "read_file"}}
    c = post(up, tools=TOOLS, tool_choice=named).json()["choices"][0]
    assert c["finish_reason"] == "stop"
    assert c["message"]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "ls"}'}
    acc = merge(events(up, tools=TOOLS, tool_choice=named))
    assert acc["calls"][0]["name"] == "read_file" and json.loads(acc["calls"][0]["arguments"]) == {"path": "ls"}
    assert acc["finish"] == "stop" and acc["reasoning"] == "\nCalling the tool.\n"
    acc = merge(events(up, tools=TOOLS, tool_choice="required"))
    assert acc["finish"] == "tool_calls" and acc["content"] == ""
    assert acc["calls"][0]["arguments"] == up.responses[-1].tool_calls[0]["function"]["arguments"]


def test_8_2_json_schema_response_format(up):
    schema = {"type": "object", "properties": {"title": {"type": "STRING"}, "n": {"type": "integer"}},
              "required": ["title", "n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    content = post(up, response_format=fmt).json()["choices"][0]["message"]["content"]
    assert json.loads(content) == {"title": "ls", "n": 1} == minimal_json(schema)


def test_8_3_runs_as_a_module(tok):
    import subprocess
    import sys
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.scripted_upstream", "--port", str(port),
                             "--tokenizer", str(tok.path)], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        assert proc.stdout.readline().strip() == f"http://127.0.0.1:{port}/v1"
        assert httpx.get(f"http://127.0.0.1:{port}/version").json() == {"version": "0.32.0"}
    finally:
        proc.terminate()
        proc.wait(10)


# ---- 9.x round trip -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reply", [
    Reply(text="Hello there."),
    Reply(text="Checking.", reasoning="Plan: run ls.", tool_calls=[("bash", {"command": "ls", "timeout": 2})]),
    Reply(reasoning="Two at once.", tool_calls=[("bash", {"command": "pwd", "timeout": 1}),
                                                ("read_file", {"path": "é.txt"})]),
])
def test_9_1_echoed_turn_extends_prompt_plus_completion(up, reply):
    up.script(reply)
    r1 = post(up, tools=TOOLS).json()
    msg = {k: v for k, v in r1["choices"][0]["message"].items() if k in ("role", "content", "tool_calls")}
    msg["reasoning_content"] = r1["choices"][0]["message"]["reasoning"]
    history = USER + [msg] + [{"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                              for c in msg["tool_calls"]] + ([] if msg["tool_calls"] else [{"role": "user", "content": "more"}])
    r2 = post(up, tools=TOOLS, messages=history).json()
    p1, c1 = r1["prompt_token_ids"], r1["choices"][0]["token_ids"]
    assert r2["prompt_token_ids"][: len(p1) + len(c1)] == p1 + c1


# ---- 10.x reasoning parser interplay in streams (vLLM behaviour) ------------------------------------------------

def test_10_1_history_reasoning_ends_reasoning_in_stream(up):
    history = USER + [{"role": "assistant", "content": "ok", "reasoning_content": "old"},
                      {"role": "user", "content": "again"}]
    up.script(Reply(text="Fine.", reasoning="new thought", tool_calls=[("bash", {"command": "ls", "timeout": 1})]))
    acc = merge(events(up, tools=TOOLS, messages=history))
    assert acc["reasoning"] == "" and acc["content"].startswith("<think>\nnew thought\n</think>")
    assert acc["calls"][0]["name"] == "bash"
    up.script(Reply(text="Fine.", reasoning="new thought"))
    assert merge(events(up, messages=history))["reasoning"] == "\nnew thought\n"  # no tools: parser as usual


def test_10_2_first_turn_tool_call_without_reasoning(up):
    up.script(Reply(tool_calls=[("bash", {"command": "ls", "timeout": 1})]))
    acc = merge(events(up, tools=TOOLS))
    assert acc["calls"] == {} and acc["content"].startswith("<tool_call>")  # never reached the tool parser
    assert up.responses[-1].tool_calls[0]["function"]["name"] == "bash"    # non-streaming parse would find it
    with ScriptedUpstream(up.tokenizer, reasoning_parser=None) as plain:
        plain.script(Reply(tool_calls=[("bash", {"command": "ls", "timeout": 1})]))
        acc = merge(events(plain, tools=TOOLS))
        assert acc["calls"][0]["name"] == "bash" and acc["content"] == "" and acc["finish"] == "tool_calls"
