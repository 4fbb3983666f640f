"""Bad agent input: hypothesis on the four codecs' to_chat, and a bounded fuzz of raw bodies through the live proxy.

No input crashes anything: to_chat returns a ChatPlan (whose chat body serializes) or raises AgentInputError; through
the proxy every answer is the provider's success or its error shape (never mitmproxy's 502), the proxy keeps serving,
and its log shows no failed call. Counts are printed (`pytest -s`).

Scenarios: 1.x codecs (unit, hypothesis) · 2.x raw bodies through the live proxy.
"""

from __future__ import annotations

import collections
import copy
import gzip
import json
import random

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.addon.codecs import anthropic, google, openai_chat, openai_responses
from polar.addon.codecs.base import AgentInputError, ChatPlan
from tests.reliability import BY_NAME, PROTOCOLS, json_ok, stream_ending
from tests.support.gateway import start_gateway
from tests.support.scripted_upstream import Reply

# Valid, feature-rich bodies (system, tools, a tool round trip, reasoning) that mutations start from, so fuzzing
# reaches deep into every codec rather than failing at the first field.
SEEDS = {
    "anthropic_messages": {
        "model": "claude-test", "max_tokens": 64, "stream": True, "temperature": 0.5, "stop_sequences": ["STOP"],
        "system": [{"type": "text", "text": "be brief"}],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {
            "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}],
        "messages": [
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "I will run ls.", "signature": "sig"},
                                              {"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                               "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}]},
    "openai_chat": {
        "model": "gpt-test", "stream": True, "max_tokens": 64, "tool_choice": "auto",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "list files"}]},
            {"role": "assistant", "content": None, "reasoning_content": "run ls",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "sh", "arguments": "{\"command\": \"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}],
        "tools": [{"type": "function", "function": {"name": "sh", "parameters": {
            "type": "object", "properties": {"command": {"type": "string"}}}}}]},
    "openai_responses": {
        "model": "gpt-test", "stream": True, "instructions": "be brief", "max_output_tokens": 64,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
            {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{\"command\": \"ls\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}],
        "tools": [{"type": "function", "name": "sh", "parameters": {
            "type": "object", "properties": {"command": {"type": "string"}}}}]},
    "google_generate": {
        "contents": [
            {"role": "user", "parts": [{"text": "list files"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "sh", "args": {"command": "ls"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "sh", "response": {"output": "a.txt"}}}]}],
        "systemInstruction": {"parts": [{"text": "be brief"}]},
        "tools": [{"functionDeclarations": [{"name": "sh", "parameters": {
            "type": "OBJECT", "properties": {"command": {"type": "STRING"}}}}]}],
        "generationConfig": {"maxOutputTokens": 64, "temperature": 0.5}},
}

CODEC_NAMES = ["anthropic_messages", "openai_chat", "openai_responses", "google_generate"]

CODECS = {"anthropic_messages": anthropic, "openai_chat": openai_chat, "openai_responses": openai_responses,
          "google_generate": google}
ROUTE_ARGS = {
    "anthropic_messages": ("api.anthropic.com", "/v1/messages"),
    "openai_chat": ("api.openai.com", "/v1/chat/completions"),
    "openai_responses": ("api.openai.com", "/v1/responses"),
    "google_generate": ("generativelanguage.googleapis.com", "/v1beta/models/gemini-test:streamGenerateContent"),
}

JUNK = [None, True, False, 0, -1, 2 ** 31, 1.5, -1e300, "", "x", "\u0000", "é" * 3, "x" * 2000, [], {}, [[]],
        [None], {"type": "unknown_type"}, {"text": 1}, {"role": "user"}, [{"type": "text"}], {"": ""}]


def _slots(node, path=()):
    """Every (path) to a value inside a JSON document."""
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _slots(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _slots(v, path + (i,))


def _set(doc, path, value):
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


def mutate(rng: random.Random, seed: dict, n: int | None = None) -> object:
    """A seed body with 1–3 random edits: a value replaced by junk or by a sibling of the wrong type, a key
    dropped, an unknown field added, a list emptied or duplicated."""
    doc = copy.deepcopy(seed)
    for _ in range(n or rng.randint(1, 3)):
        slots = list(_slots(doc))
        path = rng.choice(slots)
        op = rng.randrange(5)
        if op == 0 or not path:
            doc = _set(doc, path, copy.deepcopy(rng.choice(JUNK)))
        elif op == 1:
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif isinstance(parent, list) and parent:
                parent.pop(path[-1])
        elif op == 2:
            target = doc
            for key in path:
                target = target[key]
            if isinstance(target, dict):
                target[rng.choice(["unknown_field", "x_polar_fuzz", "cache_control", "type", "role", "id"])] = \
                    copy.deepcopy(rng.choice(JUNK))
            else:
                doc = _set(doc, path, {"value": target})
        elif op == 3:
            target = doc
            for key in path:
                target = target[key]
            doc = _set(doc, path, [target, copy.deepcopy(target)] if not isinstance(target, list) else target * 2)
        else:
            other = doc
            for key in rng.choice(slots):
                other = other[key]
            doc = _set(doc, path, copy.deepcopy(other))
    return doc


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["model", "messages", "role", "content", "type", "text", "tools", "input", "contents",
                         "parts", "stream", "max_tokens", "system", "name", "arguments", "tool_calls", "n",
                         "functionCall", "generationConfig", "tool_choice", "x"]) | st.text(max_size=8),
        inner, max_size=5),
    max_leaves=25)


def _route(name: str):
    host, path = ROUTE_ARGS[name]
    return CODECS[name].route("POST", host, path, [("content-type", "application/json")])


# -- 1. codecs --------------------------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("name", CODEC_NAMES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_1_1_any_json_is_a_plan_or_a_400(name, data):
    codec, route = CODECS[name], _route(name)
    if data.draw(st.booleans(), label="from_seed"):
        body = mutate(data.draw(st.randoms(use_true_random=False), label="rng"), SEEDS[name])
    else:
        body = data.draw(json_values, label="body")
    try:
        plan = codec.to_chat(body, route)
    except AgentInputError as exc:
        assert exc.message and exc.kind == "bad_request"
        return
    assert isinstance(plan, ChatPlan)
    orjson.dumps(plan.chat)  # what the gateway sends upstream must serialize
    assert isinstance(plan.chat.get("messages"), list)


@pytest.mark.unit
@pytest.mark.parametrize("name", list(CODECS))
def test_1_2_seeds_translate(name):
    assert isinstance(CODECS[name].to_chat(copy.deepcopy(SEEDS[name]), _route(name)), ChatPlan)


# -- 2. raw bodies through the live proxy --------------------------------------------------------------------------

MAX_BODY_MB = 0.25
FUZZ_PER_PROTOCOL = 30


@pytest.fixture(scope="module")
def small_gateway(_upstream_server, tmp_path_factory):
    """A gateway of its own (a clean log to scan) with a small polar_max_body_mb."""
    base = tmp_path_factory.mktemp("badinput")
    with start_gateway(_upstream_server.base_url, str(base / "run"), str(base / "flows"),
                       sets=[f"polar_max_body_mb={MAX_BODY_MB}"]) as gw:
        yield gw


def fixed_cases(name: str) -> list[tuple[str, bytes, dict]]:
    """(label, raw body, extra headers) — the classic bad inputs, for one protocol."""
    seed = SEEDS[name]
    good = json.dumps(seed).encode()
    big_text = "word " * int(MAX_BODY_MB * 1024 * 1024 / 4)
    oversize = copy.deepcopy(seed)
    holder, key = _first_text_holder(oversize)
    holder[key] = big_text
    cases = [
        ("empty_body", b"", {}),
        ("invalid_json", b'{"model": "m", "messages": [', {}),
        ("json_with_trailing_garbage", good + b"}}", {}),
        ("not_an_object", b'["messages"]', {}),
        ("a_string", b'"hello"', {}),
        ("null", b"null", {}),
        ("non_utf8", good[:-2] + b"\xff\xfe\x80" + good[-2:], {}),
        ("non_utf8_latin1_text", json.dumps(seed, ensure_ascii=False).replace("files", "fïles").encode("latin-1"), {}),
        ("nan_and_huge_int", good.replace(b"64", b"NaN", 1).replace(b"0.5", b"1" + b"0" * 40, 1), {}),
        ("lone_surrogate", good.replace(b"list files", b"\\ud800 files", 1), {}),
        ("deep_nesting_100k", b"[" * 100_000 + b"]" * 100_000, {}),
        ("deep_nesting_inside_content", _nested(seed, name, 400), {}),
        ("unknown_fields", json.dumps({**seed, "x_unknown": {"a": [1, 2]}, "another_unknown": None}).encode(), {}),
        ("oversize_body", json.dumps(oversize).encode(), {}),
        ("bad_gzip", b"\x1f\x8b not gzip at all", {"content-encoding": "gzip"}),
        ("gzip_ok", gzip.compress(good), {"content-encoding": "gzip"}),
        ("wrong_content_type", good, {"content-type": "text/plain"}),
    ]
    if name == "openai_chat":
        cases.append(("n_2", json.dumps({**seed, "n": 2}).encode(), {}))
    if name == "google_generate":
        cases.append(("candidate_count_2", json.dumps(
            {**seed, "generationConfig": {**seed["generationConfig"], "candidateCount": 2}}).encode(), {}))
    return cases


def _first_text_holder(doc: dict) -> tuple[dict, str]:
    if "messages" in doc:
        return doc["messages"][0], "content"
    if "contents" in doc:
        return doc["contents"][0]["parts"][0], "text"
    return doc["input"][0]["content"][0], "text"


def _nested(seed: dict, name: str, depth: int) -> bytes:
    doc = copy.deepcopy(seed)
    deep: object = "bottom"
    for _ in range(depth):
        deep = {"a": [deep]}
    if name == "google_generate":
        doc["tools"][0]["functionDeclarations"][0]["parameters"]["properties"]["deep"] = deep
    elif name == "openai_chat":
        doc["tools"][0]["function"]["parameters"]["properties"]["deep"] = deep
    elif name == "openai_responses":
        doc["tools"][0]["parameters"]["properties"]["deep"] = deep
    else:
        doc["tools"][0]["input_schema"]["properties"]["deep"] = deep
    return json.dumps(doc).encode()


def check_answer(name: str, status: int, raw: bytes, headers) -> str:
    """Classify one answer; fail unless it is provider-shaped."""
    proto = BY_NAME[name]
    assert status != 502, raw[:300]
    if status == 200:
        if "text/event-stream" in headers.get("content-type", ""):
            assert stream_ending(proto, raw) == "ok", raw[-300:]
        else:
            assert json_ok(proto, raw), raw[:300]
        return "200"
    assert proto.error_ok(status, raw), (status, raw[:300])
    return str(status)


@pytest.mark.integration
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_2_1_raw_bodies_get_provider_shaped_answers(small_gateway, upstream, name):
    proto = BY_NAME[name]
    small_gateway.mark()
    rng = random.Random(f"polar-fuzz-{name}")
    cases = fixed_cases(name)
    cases += [(f"mutation_{i}", json.dumps(mutate(rng, SEEDS[name])).encode(), {}) for i in range(FUZZ_PER_PROTOCOL)]
    counts: collections.Counter = collections.Counter()
    expect = {"empty_body": 400, "invalid_json": 400, "json_with_trailing_garbage": 400, "not_an_object": 400,
              "a_string": 400, "null": 400, "non_utf8": 400, "non_utf8_latin1_text": 400, "nan_and_huge_int": 400,
              "deep_nesting_100k": 400, "bad_gzip": 400, "oversize_body": proto.errors["too_large"][0],
              "unknown_fields": 200, "gzip_ok": 200, "n_2": 400, "candidate_count_2": 400}
    with small_gateway.http_client(session="fuzz", timeout=30) as client:
        for label, raw, headers in cases:
            hdrs = {"content-type": "application/json", "x-api-key": "sk-fuzz", **headers}
            resp = client.post(proto.url(True), content=raw, headers=hdrs)
            kind = check_answer(name, resp.status_code, resp.content, resp.headers)
            counts[kind] += 1
            if label in expect:
                assert resp.status_code == expect[label], (label, resp.status_code, resp.content[:300])
        # The proxy keeps serving: a plain call is answered in full.
        resp = client.post(proto.url(True), json=proto.body(True, "still there?"))
        assert resp.status_code == 200 and stream_ending(proto, resp.content) == "ok"
    records = small_gateway.records()
    # Every generation request that reached the gateway wrote a record (count_tokens etc. are not in the set).
    assert len(records) == len(cases) + 1, (len(records), len(cases))
    odd = [(r["error"], r["request"][:200]) for r in records
           if r["error"] is not None and r["error"]["stage"] not in ("agent_input", "backend_status")]
    assert not odd, odd
    log = small_gateway.log_text()
    assert "Traceback" not in log and " failed" not in log.replace("failed to load", ""), log[-2000:]
    print(f"\n[fuzz] {name}: {len(cases)} bodies → " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CODECS))
def test_2_2_an_empty_backend_stream_is_a_well_formed_answer(small_gateway, upstream, name):
    proto = BY_NAME[name]
    upstream.script(Reply(ids=[]), Reply(ids=[]))
    with small_gateway.http_client(session="fuzz", timeout=30) as client:
        stream = client.post(proto.url(True), json=proto.body(True, "say nothing"))
        whole = client.post(proto.url(False), json=proto.body(False, "say nothing"))
    assert stream.status_code == 200 and stream_ending(proto, stream.content) == "ok", stream.content[-300:]
    assert whole.status_code == 200, whole.content[:300]
    json.loads(whole.content)
