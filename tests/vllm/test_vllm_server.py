"""The real vLLM server our gateway talks to (scripts/vllm, docs/field-notes.md: vLLM): what it sends back is what the
records store, so these tests pin the wire facts the gateway relies on.

1.x  the server: starts, lists the served model and its context, answers /health and /version
2.x  token data: JSON and streamed chat carry prompt ids, completion ids and one logprob per id; /tokenize equals
     the chat call's prompt ids
3.x  tool calls on the tiny model: forced (required / named) calls parse, streamed as tool-call deltas; auto accepted
4.x  the qwen3 reasoning parser: loaded, answers are content by default, `enable_thinking` splits at </think>
5.x  --logprobs-mode processed_logprobs: logprobs after top-k, raw ones before
6.x  SmolLM2: answers sensibly and makes a forced tool call
"""

from __future__ import annotations

import json

import pytest

from tests.support.vllm_server import VllmServer, shared_vllm, start_vllm, stop_vllm

pytestmark = pytest.mark.vllm

TOKEN_FIELDS = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    {"role": "system", "content": "Answer in one line."},
    {"role": "user", "content": "And what should I wear?"},
]


@pytest.fixture(scope="module")
def tiny() -> VllmServer:
    return shared_vllm("tiny")


@pytest.fixture(scope="module")
def client(tiny):
    with tiny.client() as c:
        yield c


def chat(client, server: VllmServer, **body) -> dict:
    r = client.post(server.base_url + "/chat/completions", json={"model": server.model, **TOKEN_FIELDS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def chat_stream(client, server: VllmServer, **body) -> list[dict]:
    """The parsed `data:` events of a streamed chat call; asserts it ends with [DONE]."""
    body = {"model": server.model, **TOKEN_FIELDS, "stream": True, "stream_options": {"include_usage": True}, **body}
    events, done = [], False
    with client.stream("POST", server.base_url + "/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            assert not done, "data after [DONE]"
            if line == "data: [DONE]":
                done = True
            else:
                events.append(json.loads(line[len("data: "):]))
    assert done
    return events


def detokenize(client, server: VllmServer, ids: list[int]) -> str:
    r = client.post(server.root_url + "/detokenize", json={"model": server.model, "tokens": ids})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def token_id(client, server: VllmServer, text: str) -> int:
    r = client.post(server.root_url + "/tokenize",
                    json={"model": server.model, "prompt": text, "add_special_tokens": False})
    ids = r.json()["tokens"]
    assert len(ids) == 1, f"{text!r} is not one token: {ids}"
    return ids[0]


# 1.x the server


def test_1_1_lists_the_served_model_with_its_context(client, tiny):
    card = client.get(tiny.base_url + "/models").json()["data"]
    assert [m["id"] for m in card] == [tiny.model]
    assert card[0]["max_model_len"] == tiny.max_model_len
    if tiny.run_file is not None:  # started by us: the tiny preset's 64k context
        assert tiny.max_model_len == 65536


def test_1_2_answers_health_and_version(client, tiny):
    assert client.get(tiny.root_url + "/health").status_code == 200
    version = client.get(tiny.root_url + "/version").json()["version"]
    body = chat(client, tiny, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert body["system_fingerprint"].startswith(f"vllm-{version}")


# 2.x token data


def test_2_1_json_chat_carries_prompt_ids_completion_ids_and_a_logprob_per_id(client, tiny):
    body = chat(client, tiny, messages=CONVERSATION, tools=[WEATHER_TOOL], max_tokens=16, temperature=1.0, seed=7)
    choice = body["choices"][0]
    ids, lps = choice["token_ids"], choice["logprobs"]["content"]
    assert len(ids) == len(lps) == body["usage"]["completion_tokens"] == 16
    assert len(body["prompt_token_ids"]) == body["usage"]["prompt_tokens"]
    assert choice["finish_reason"] == "length"
    assert all(set(lp) >= {"token", "logprob", "bytes", "top_logprobs"} and lp["logprob"] <= 0.0 for lp in lps)
    # Unconstrained sampling from a random model over a 3k vocabulary: raw logprobs are far from 0.
    assert sum(lp["logprob"] for lp in lps) / len(lps) < -3.0
    assert detokenize(client, tiny, ids) == choice["message"]["content"]


def test_2_2_streamed_chat_carries_prompt_ids_first_then_ids_and_logprobs_per_chunk(client, tiny):
    events = chat_stream(client, tiny, messages=CONVERSATION, max_tokens=12, temperature=1.0, seed=7)
    assert "prompt_token_ids" in events[0]
    assert all("prompt_token_ids" not in e or e["prompt_token_ids"] is None for e in events[1:])
    ids, lps, text, finish = [], [], "", None
    for e in events[:-1]:
        for choice in e["choices"]:
            ids += choice.get("token_ids") or []
            lps += (choice.get("logprobs") or {}).get("content") or []
            text += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
    usage_event = events[-1]
    assert usage_event["choices"] == []
    assert len(ids) == len(lps) == usage_event["usage"]["completion_tokens"] == 12
    assert len(events[0]["prompt_token_ids"]) == usage_event["usage"]["prompt_tokens"]
    assert finish == "length"
    # A stream cut by `length` inside a UTF-8 sequence never sends the dangling bytes as text; the ids hold them.
    full = detokenize(client, tiny, ids)
    assert full.startswith(text) and set(full[len(text):]) <= {"\ufffd"}
    # Same request, same seed, not streamed: the same tokens.
    body = chat(client, tiny, messages=CONVERSATION, max_tokens=12, temperature=1.0, seed=7)
    assert body["choices"][0]["token_ids"] == ids
    assert body["prompt_token_ids"] == events[0]["prompt_token_ids"]


def test_2_3_tokenize_equals_the_chat_calls_prompt_ids(client, tiny):
    body = chat(client, tiny, messages=CONVERSATION, tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=1)
    r = client.post(tiny.root_url + "/tokenize",
                    json={"model": tiny.model, "messages": CONVERSATION, "tools": [WEATHER_TOOL, TIME_TOOL]})
    assert r.status_code == 200, r.text
    tok = r.json()
    assert tok["tokens"] == body["prompt_token_ids"]
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == tiny.max_model_len


def test_2_4_a_stop_turn_ends_with_the_eos_id_the_text_omits(client, tiny):
    eos = token_id(client, tiny, "<|im_end|>")
    body = chat(client, tiny, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0,
                logit_bias={str(eos): 100})
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert choice["token_ids"] == [eos] and choice["message"]["content"] == ""


# 3.x tool calls (tiny: hermes parser; forced calls take the JSON-schema path)


def test_3_1_required_tool_call_parses_with_schema_arguments(client, tiny):
    body = chat(client, tiny, messages=CONVERSATION[:2], tools=[WEATHER_TOOL], tool_choice="required",
                parallel_tool_calls=False, max_tokens=128, temperature=0)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Tokyo")
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == body["usage"]["completion_tokens"]


def test_3_2_required_tool_call_streams_as_tool_call_deltas(client, tiny):
    events = chat_stream(client, tiny, messages=CONVERSATION[:2], tools=[WEATHER_TOOL], tool_choice="required",
                         parallel_tool_calls=False, max_tokens=128, temperature=0)
    deltas = [tc for e in events for c in e["choices"] for tc in c["delta"].get("tool_calls") or []]
    assert deltas and deltas[0]["id"] and deltas[0]["function"]["name"] == "get_weather"
    assert {d["index"] for d in deltas} == {0}
    args = "".join(d["function"].get("arguments") or "" for d in deltas)
    assert json.loads(args)["city"] in ("Paris", "Tokyo")
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
    assert finish == ["tool_calls"]
    ids = [i for e in events for c in e["choices"] for i in c.get("token_ids") or []]
    assert len(ids) == events[-1]["usage"]["completion_tokens"]


def test_3_3_named_tool_choice_calls_that_tool(client, tiny):
    body = chat(client, tiny, messages=CONVERSATION[:2], tools=[WEATHER_TOOL, TIME_TOOL],
                tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=64, temperature=0)
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time" and json.loads(call["function"]["arguments"]) == {}


def test_3_4_auto_tool_choice_is_accepted(client, tiny):
    # Without --enable-auto-tool-choice vLLM answers tools + auto with 400 (docs/field-notes.md: vLLM).
    body = chat(client, tiny, messages=CONVERSATION[:2], tools=[WEATHER_TOOL], max_tokens=8, temperature=0)
    assert body["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls")


# 4.x reasoning parser (qwen3; the preset defaults enable_thinking to false)


def test_4_1_answers_are_content_by_default(client, tiny):
    body = chat(client, tiny, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=1.0, seed=3)
    message = body["choices"][0]["message"]
    assert message["reasoning"] is None
    assert message["content"] == detokenize(client, tiny, body["choices"][0]["token_ids"])


def test_4_2_enable_thinking_splits_reasoning_at_think_end(client, tiny):
    hell, think_end = token_id(client, tiny, "hell"), token_id(client, tiny, "</think>")
    split_seen = False
    for seed in range(6):
        body = chat(client, tiny, messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=1.0,
                    seed=seed, allowed_token_ids=[hell, think_end],
                    chat_template_kwargs={"enable_thinking": True})
        choice = body["choices"][0]
        ids, message = choice["token_ids"], choice["message"]
        assert len(ids) == len(choice["logprobs"]["content"]) == 6  # ids and logprobs survive the parser
        k = ids.index(think_end) if think_end in ids else len(ids)
        assert message["reasoning"] == ("hell" * k or None)
        if think_end not in ids:
            assert message["content"] is None
        split_seen |= 0 < k < len(ids)
    assert split_seen, "no seed produced reasoning followed by </think>"


# 5.x logprobs modes


@pytest.fixture(scope="module")
def tiny_processed():
    server = start_vllm("tiny", logprobs_mode="processed_logprobs")
    yield server
    stop_vllm(server)


def test_5_1_processed_logprobs_are_taken_after_top_k_raw_before(client, tiny, tiny_processed):
    request = dict(messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=1.0, top_k=1, seed=1)
    raw = chat(client, tiny, **request)["choices"][0]
    with tiny_processed.client() as c:
        processed = chat(c, tiny_processed, **request)["choices"][0]
    assert processed["token_ids"] == raw["token_ids"]  # top_k=1 is greedy: same weights, same tokens
    assert [lp["logprob"] for lp in processed["logprobs"]["content"]] == [0.0] * 8
    assert all(lp["logprob"] < -1.0 for lp in raw["logprobs"]["content"])


# 6.x SmolLM2 (the demo's model)


@pytest.fixture(scope="module")
def smollm2() -> VllmServer:
    return shared_vllm("smollm2")


def test_6_1_smollm2_answers_sensibly(smollm2):
    with smollm2.client() as c:
        body = chat(c, smollm2, messages=[{"role": "user", "content": "What is the capital of France?"}],
                    max_tokens=24, temperature=0)
        eos = token_id(c, smollm2, "<|im_end|>")
    choice = body["choices"][0]
    assert "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] == eos


def test_6_2_smollm2_forced_tool_call_then_plain_answer(smollm2):
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    with smollm2.client() as c:
        first = chat(c, smollm2, messages=messages, tools=[tool], tool_choice="required", max_tokens=64,
                     temperature=0)["choices"][0]
        # Forced (`required`) means one call or more: the guided JSON is a list, and greedy SmolLM2 may fill in two.
        calls = first["message"]["tool_calls"]
        assert calls and all(call["function"]["name"] == "get_weather" for call in calls)
        assert "paris" in json.loads(calls[0]["function"]["arguments"])["city"].lower()
        messages += [{"role": "assistant", "content": None, "tool_calls": calls},
                     *({"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 21 C"} for call in calls)]
        second = chat(c, smollm2, messages=messages, tools=[tool], tool_choice="none", max_tokens=32,
                      temperature=0)["choices"][0]
    assert second["message"]["content"] and not second["message"].get("tool_calls")
