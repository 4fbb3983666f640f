"""Exact on-policy mode end to end: real mitmdump + TLS, the OpenAI SDK as the agent, the scripted upstream with
vLLM's tokens-in chat (tests/support/exact_upstream.py), then polar-process on the flows.

1.x  splicing: turn N+1's prompt is exactly prompt N + sampled ids (+ end-of-turn) + the canonical tail; the
     upstream request carries those ids; the record stores the compact form and the reader rebuilds it
2.x  a three-turn tool session (agent re-serializes tool arguments, drops nothing): polar-process finds 0 breaks,
     0 context_mismatch, and the merged sequence is exactly what the sampler saw, token by token
3.x  fallbacks take the normal path and say why: edited history, images, echo mismatch
4.x  the startup probe: a backend that ignores prompt ids → mode refused, every call still answered
5.x  streaming stays real on a spliced turn (gated upstream)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading

import orjson
import polars as pl
import pytest

from polar import records as rec
from polar.processor.cli import main as polar_process
from tests.support.exact_upstream import ExactUpstream
from tests.support.gateway import start_gateway
from tests.support.scripted_upstream import Reply
from tests.support.sdk import openai_sdk

pytestmark = pytest.mark.integration

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                        "required": ["command"]}}}


@contextlib.contextmanager
def _started(tmp_path_factory, tokenizer_dir, name: str, honour: bool = True):
    base = tmp_path_factory.mktemp(name)
    with ExactUpstream(tokenizer_dir, honour_prompt_ids=honour) as up, \
            start_gateway(up.base_url, str(base / "run"), str(base / "flows"), sets=["polar_exact=true"]) as gw:
        yield up, gw


@pytest.fixture(scope="module")
def exact_env(tmp_path_factory, tokenizer_dir):
    with _started(tmp_path_factory, tokenizer_dir, "exact") as (up, gw):
        yield up, gw


@pytest.fixture
def env(exact_env):
    up, gw = exact_env
    up.reset()
    openai_sdk(gw, "warmup").chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    up.reset()  # the probe ran at the first call ever: scripts below are consumed by the test's own calls
    gw.mark()
    return up, gw


def _split(tok, text: str) -> list[int]:
    """Deliberately non-canonical ids: one token per character."""
    return [i for ch in text for i in tok.encode(ch)]


def _prompt(r: dict) -> list[int]:
    return rec.unpack_ids(r["prompt_token_ids"])


def _assistant(msg) -> dict:
    out = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        # An agent re-serializes tool arguments (here: compact JSON): compared as parsed JSON, so still a parent.
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": json.dumps(json.loads(c.function.arguments), separators=(",", ":"))}}
            for c in msg.tool_calls]
    return out


def _process(gw, tmp_path, eot: int) -> tuple[dict, pl.DataFrame]:
    flows = tmp_path / "flows"
    flows.mkdir()
    for path in rec.expand_inputs([gw.flows_dir]):
        shutil.copy(path, flows / os.path.basename(path).removesuffix(".open"))
    assert polar_process([str(flows), "-o", str(tmp_path / "out"), "-q", "--eot-token-id", str(eot)]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    return report, pl.read_parquet(tmp_path / "out" / "sequences.parquet")


def test_1_1_second_turn_is_spliced_from_the_sampled_ids(env):
    up, gw = env
    tok = up.tokenizer
    eot = tok.token_to_id("<|im_end|>")
    sampled = _split(tok, "Sure thing")
    up.script(Reply(ids=sampled + [eot]), Reply(text="Done."))
    client = openai_sdk(gw, "s11")
    msgs = [{"role": "user", "content": "hello"}]
    r1 = client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert r1.choices[0].message.content == "Sure thing"
    msgs += [{"role": "assistant", "content": "Sure thing"}, {"role": "user", "content": "again"}]
    r2 = client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert r2.choices[0].message.content == "Done."
    first, second = gw.records()
    p1, c1 = _prompt(first), rec.unpack_ids(first["completion_token_ids"])
    assert c1 == sampled + [eot]
    assert first["exact"]["path"] == "normal" and first["exact"]["fallback_reason"] == "new_conversation"
    ex = second["exact"]
    assert ex["path"] == "exact" and ex["fallback_reason"] is None and ex["parent"] == first["id"]
    canonical = tok.apply_chat_template(msgs)
    sent = up.chat_requests[-1].body["kv_transfer_params"]["prompt_token_ids"]
    assert sent[:len(p1) + len(c1)] == p1 + c1 and sent != canonical  # the canonical render re-tokenized "Sure"
    assert sent[len(p1) + len(c1):] == canonical[ex["render_len"] - (len(sent) - ex["splice_pos"]):]
    assert ex["splice_pos"] == len(p1) + len(c1) and ex["eot_count"] == 2 and ex["drift"] > 0
    # Compact on disk, rebuilt by the reader; the recorded upstream request does not repeat the ids.
    assert second["prompt_ref"] == {"id": first["id"], "len": len(p1) + len(c1)}
    assert _prompt(second) == sent == up.responses[-1].prompt_token_ids
    assert rec.unpack_ids(second["prompt_tail_ids"]) == sent[len(p1) + len(c1):]
    assert orjson.loads(second["upstream_request"])["kv_transfer_params"]["prompt_token_ids"] == "<record prompt_token_ids>"


def test_1_2_a_turn_cut_by_max_tokens_gets_the_templates_end_of_turn(env):
    up, gw = env
    tok = up.tokenizer
    eot = tok.token_to_id("<|im_end|>")
    up.script(Reply(text="one two three four five six"), Reply(text="ok"))
    client = openai_sdk(gw, "s12")
    msgs = [{"role": "user", "content": "count"}]
    r1 = client.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=3)
    assert r1.choices[0].finish_reason == "length"
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="gpt-4o", messages=msgs)
    first, second = gw.records()
    c1 = rec.unpack_ids(first["completion_token_ids"])
    assert len(c1) == 3 and eot not in c1
    p2 = _prompt(second)
    base = _prompt(first) + c1
    assert second["exact"]["path"] == "exact" and p2[:len(base)] == base and p2[len(base)] == eot


def test_2_1_tool_session_merges_into_exactly_what_the_sampler_saw(env, tmp_path):
    up, gw = env
    tok = up.tokenizer
    eot = tok.token_to_id("<|im_end|>")
    up.script(Reply(reasoning="List it.", tool_calls=[("bash", {"command": "ls -la"})]), Reply(ids=_split(tok, "Two files.") + [eot]),
              Reply(text="Bye."))
    client = openai_sdk(gw, "s21")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is here?"}]
    r1 = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=[BASH])
    call = r1.choices[0].message.tool_calls[0]
    msgs += [_assistant(r1.choices[0].message), {"role": "tool", "tool_call_id": call.id, "content": "a\nb"}]
    r2 = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=[BASH])
    msgs += [_assistant(r2.choices[0].message), {"role": "user", "content": "Thanks"}]
    client.chat.completions.create(model="gpt-4o", messages=msgs, tools=[BASH])
    recs = gw.records()
    assert [r["exact"]["path"] for r in recs] == ["normal", "exact", "exact"]
    for a, b in zip(recs, recs[1:]):
        pa, ca = _prompt(a), rec.unpack_ids(a["completion_token_ids"])
        assert _prompt(b)[:len(pa) + len(ca)] == pa + ca  # prompt N+1 starts with prompt N + sampled ids
    report, seqs = _process(gw, tmp_path, eot)
    s21 = seqs.filter(pl.col("session") == "s21")
    assert report["breaks"] == [] and report["flags"].get("context_mismatch", 0) == 0
    assert s21.height == 1 and s21["n_calls"][0] == 3
    last = recs[-1]
    truth = up.responses[-1].prompt_token_ids + up.responses[-1].completion_ids
    assert s21["input_ids"][0].to_list() == truth == _prompt(last) + rec.unpack_ids(last["completion_token_ids"])


def test_3_1_edited_history_takes_the_normal_path(env):
    up, gw = env
    up.script(Reply(text="First."), Reply(text="Second."))
    client = openai_sdk(gw, "s31")
    msgs = [{"role": "user", "content": "hello"}]
    client.chat.completions.create(model="gpt-4o", messages=msgs)
    edited = msgs + [{"role": "assistant", "content": "Something I never said."}, {"role": "user", "content": "?"}]
    client.chat.completions.create(model="gpt-4o", messages=edited)
    second = gw.records()[-1]
    assert second["exact"]["path"] == "normal" and second["exact"]["fallback_reason"] == "history_edited"
    assert "kv_transfer_params" not in up.chat_requests[-1].body
    assert _prompt(second) == up.tokenizer.apply_chat_template(edited) and second["prompt_ref"] is None


def test_3_2_images_take_the_normal_path(env):
    up, gw = env
    up.script(Reply(text="First."), Reply(text="A cat."))
    client = openai_sdk(gw, "s32")
    msgs = [{"role": "user", "content": "hello"}]
    client.chat.completions.create(model="gpt-4o", messages=msgs)
    msgs += [{"role": "assistant", "content": "First."},
             {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    answer = client.chat.completions.create(model="gpt-4o", messages=msgs)  # the image call is served, normally
    assert answer.choices[0].message.content == "A cat." and answer.choices[0].finish_reason == "stop"
    second = gw.records()[-1]
    assert second["error"] is None and second["provider_status"] == 200
    assert second["exact"]["fallback_reason"] == "media" and second["exact"]["parent"] == gw.records()[0]["id"]
    assert "kv_transfer_params" not in up.chat_requests[-1].body


def test_3_3_echo_mismatch_is_noticed_and_the_record_keeps_the_echo(env):
    up, gw = env
    up.script(Reply(text="First."), Reply(text="Second."))
    client = openai_sdk(gw, "s33")
    msgs = [{"role": "user", "content": "hello"}]
    client.chat.completions.create(model="gpt-4o", messages=msgs)
    up.corrupt_echo = True
    try:
        msgs += [{"role": "assistant", "content": "First."}, {"role": "user", "content": "and?"}]
        r2 = client.chat.completions.create(model="gpt-4o", messages=msgs)
    finally:
        up.corrupt_echo = False
    assert r2.choices[0].message.content == "Second."
    second = gw.records()[-1]
    assert second["exact"]["path"] == "normal" and second["exact"]["fallback_reason"] == "echo_mismatch"
    assert _prompt(second) == up.responses[-1].prompt_token_ids  # the echo, i.e. what the model really saw
    sent = orjson.loads(second["upstream_request"])["kv_transfer_params"]["prompt_token_ids"]
    assert isinstance(sent, list) and sent != _prompt(second)


def test_4_1_a_backend_that_ignores_prompt_ids_refuses_the_mode(tmp_path_factory, tokenizer_dir):
    with _started(tmp_path_factory, tokenizer_dir, "refused", honour=False) as (up, gw):
        up.script(Reply(text="probe"), Reply(text="First."), Reply(text="Second."))
        client = openai_sdk(gw, "s41")
        msgs = [{"role": "user", "content": "hello"}]
        assert client.chat.completions.create(model="gpt-4o", messages=msgs).choices[0].message.content == "First."
        msgs += [{"role": "assistant", "content": "First."}, {"role": "user", "content": "and?"}]
        assert client.chat.completions.create(model="gpt-4o", messages=msgs).choices[0].message.content == "Second."
        recs = gw.records()
        assert [r["exact"]["fallback_reason"] for r in recs] == ["mode_refused", "mode_refused"]
        assert "did not use the prompt token ids" in recs[0]["exact"]["detail"]
        assert "polar_exact REFUSED" in gw.log_text()
        assert all(_prompt(r) is not None and r["prompt_ref"] is None for r in recs)


def test_5_1_streaming_stays_real_on_a_spliced_turn(env):
    up, gw = env
    up.script(Reply(text="First."), Reply(text="one two three four", gate=True))
    client = openai_sdk(gw, "s51")
    msgs = [{"role": "user", "content": "hello"}]
    client.chat.completions.create(model="gpt-4o", messages=msgs)
    msgs += [{"role": "assistant", "content": "First."}, {"role": "user", "content": "stream"}]
    stream = client.chat.completions.create(model="gpt-4o", messages=msgs, stream=True)
    released = threading.Timer(20.0, up.release)  # never hang the suite if the first event does not come
    released.start()
    try:
        first = next(c for c in stream if c.choices and c.choices[0].delta.content)
        assert up.wait_for_gate(1.0) and not released.finished.is_set()  # first text came while the upstream waits
        up.release()
        text = first.choices[0].delta.content + "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    finally:
        released.cancel()
    assert text == "one two three four"
    assert gw.records()[-1]["exact"]["path"] == "exact"
