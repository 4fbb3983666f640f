"""The recording relay forwards unchanged and incrementally, and its truth is what the backend sent (local sockets).

1. JSON and streamed chat: the client gets exactly the bytes the relay recorded; truth = the upstream's own answer.
2. Streaming is incremental: the first content chunk reaches the client while the backend is parked.
3. Statuses, error bodies and request headers pass through; SGLang's trailing `sglext` chunk gives the truth.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.recording_relay import RecordingRelay
from tests.support.scripted_upstream import Reply, ScriptedUpstream
from tests.support.sglang_upstream import INPUT_IDS_HEADER, OUTPUT_IDS_HEADER, SGLangUpstream

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def stack(tokenizer_dir):
    up = ScriptedUpstream(tokenizer_dir)
    up.start()
    relay = RecordingRelay(up.base_url)  # a /v1 URL is accepted too
    relay.start()
    yield up, relay
    relay.stop()
    up.stop()


def chat(stream: bool, **kw) -> dict:
    return {"model": "polar-tiny", "messages": USER, "stream": stream, "logprobs": True, "return_token_ids": True,
            "stream_options": {"include_usage": True} if stream else None, **kw}


@pytest.mark.parametrize("stream", [False, True])
def test_1_client_bytes_equal_the_recorded_bytes_and_truth_equals_the_upstream(stack, stream):
    up, relay = stack
    up.reset()
    up.script(Reply(text="Hello there, friend.", reasoning="Hmm."))
    since = relay.mark()
    with httpx.Client(trust_env=False, timeout=10) as c:
        r = c.post(relay.base_url + "/chat/completions", json=chat(stream))
    (ex,) = relay.chats(since)
    assert r.status_code == ex.status == 200 and ex.complete
    assert r.content == ex.response_body
    assert ex.json()["messages"] == USER
    t, want = ex.truth(), up.responses[-1]
    assert (t.prompt_token_ids, t.completion_ids, t.logprobs) == (want.prompt_token_ids, want.completion_ids,
                                                                   want.logprobs)
    assert (t.finish_reason, t.usage["completion_tokens"]) == ("stop", len(want.completion_ids))
    assert t.content == want.content and t.reasoning == want.reasoning


def test_2_a_stream_passes_through_as_it_comes(stack):
    up, relay = stack
    up.reset()
    up.script(Reply(text="one two three", gate=True))
    with httpx.stream("POST", relay.base_url + "/chat/completions", json=chat(True), timeout=10,
                      trust_env=False) as r:
        lines = r.iter_lines()
        seen = []
        while not any('"content":"one"' in line for line in seen):
            seen.append(next(lines))
        assert up.wait_for_gate(5), "the backend is still parked after the first content chunk"
        up.release()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"


def test_3_1_statuses_error_bodies_and_headers_pass_through(stack):
    up, relay = stack
    up.reset()
    up.script(Reply(fault="status:429"))
    since = relay.mark()
    with httpx.Client(trust_env=False, timeout=10) as c:
        r = c.post(relay.base_url + "/chat/completions", json=chat(True), headers={"x-custom": "kept"})
        models = c.get(relay.base_url + "/models")
    assert r.status_code == 429 and r.json()["error"]["code"] == 429
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "polar-tiny"
    ex = relay.exchanges[since]
    assert ex.request_headers["x-custom"] == "kept" and up.chat_requests[-1].headers["x-custom"] == "kept"


def test_3_2_sglang_truth_comes_from_the_sglext_chunk(tokenizer_dir):
    with SGLangUpstream(tokenizer_dir) as up, RecordingRelay(up.root_url) as relay:
        body = chat(True)
        body.pop("return_token_ids")
        with httpx.Client(trust_env=False, timeout=10) as c:
            r = c.post(relay.base_url + "/chat/completions", json=body,
                       headers={INPUT_IDS_HEADER: "1", OUTPUT_IDS_HEADER: "1"})
        assert r.status_code == 200
        (ex,) = relay.chats()
        chunks = ex.chunks
        [ext] = [c for c in chunks if "sglext" in c]  # one chunk, output_ids one list per choice
        assert ext["choices"] == [] and len(ext["sglext"]["output_ids"]) == 1
        assert not any("token_ids" in json.dumps(c) for c in chunks if c is not ext)
        t, want = ex.truth(), up.responses[-1]
        assert (t.prompt_token_ids, t.completion_ids) == (want.prompt_token_ids, want.completion_ids)
        assert t.logprobs == want.logprobs and t.system_fingerprint is None
