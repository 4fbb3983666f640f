"""Exact on-policy mode on a real vLLM (the tiny model, CPU build), through the real proxy with the OpenAI SDK, at
temperature 1.6 (`polar_sampling_override`), where re-rendered histories break the prefix (docs/field-notes.md:
re-rendered prompts).

1.1  the startup probe accepts vLLM 0.30+ (non-canonical ids echoed unchanged)
1.2  a three-turn session (forced tool call → tool result → free answer → follow-up): every follow-up takes the exact
     path, vLLM's prompt of turn N+1 starts with prompt N + the sampled ids, and polar-process merges the session
     into one sequence with 0 breaks and 0 context_mismatch, equal to the last real prompt + completion
1.3  the proxy restarted between turns 2 and 3 (same flow directory): turn 3 is spliced from the turn cache rebuilt
     from the flow files — vLLM's prompt is prompt 2 + the sampled ids 2 (closed by the end-of-turn id) + the tail of
     turn 3's canonical render after one of its end-of-turn ids, holding the new user message only (checked without
     the splice code), what the proxy would have sent had it never restarted — and is not no_parent

Every call is seeded (`seed_per_call=SEED`: one seed per session and prompt) and the agent's tool-call ids are its own
(`call_0`, …; exact mode's history keys ignore them), so each run draws the tokens this one did: turn 2 answers with
text. An empty answer would have to be edited by the agent, and the history_edited fallback would replace the path
under test; a model or vLLM build that draws one fails here instead of passing on less.
"""

from __future__ import annotations

import json
import os
import re

import httpx
import polars as pl
import pytest

from polar import records as rec
from polar.addon.backend import tokenize_request
from polar.processor.cli import main as polar_process
from tests.support.gateway import ROOT, relayed_gateway, start_gateway
from tests.support.recording_relay import RecordingRelay
from tests.support.sdk import openai_sdk
from tests.support.vllm_server import shared_vllm

pytestmark = pytest.mark.vllm
# the per-call seed base: with the tiny model (built from a fixed seed) turn 2 of each session answers with text
SEED = 7
SAMPLING = f"polar_sampling_override=temperature=1.6,seed_per_call={SEED}"

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                        "required": ["command"]}}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    server = shared_vllm("tiny")
    base = tmp_path_factory.mktemp("exact-vllm")
    with relayed_gateway(server.root_url, base, sets=["polar_exact=true", SAMPLING]) as (relay, gw):
        yield relay, gw, base


def _ids(blob):
    return rec.unpack_ids(blob)


def _tool_turn(calls) -> list[dict]:
    """The assistant's tool calls and their results, under the agent's own ids (the ids vLLM drew are random: they
    would change the next call's seed from run to run)."""
    ids = [f"call_{i}" for i in range(len(calls))]
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for i, c in zip(ids, calls)]}] + [{"role": "tool", "tool_call_id": i, "content": "a.txt b.txt"} for i in ids]


def test_1_1_probe_accepts_vllm(setup):
    relay, gw, _ = setup
    client = openai_sdk(gw, "probe", api_key="sk", timeout=300)
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert "takes prompt token ids" in gw.log_text()
    assert gw.records()[-1]["exact"]["fallback_reason"] == "new_conversation"


def test_1_2_three_turn_session_is_exact_and_merges_without_breaks(setup):
    relay, gw, base = setup
    gw.mark()
    client = openai_sdk(gw, "exact-s1", api_key="sk", timeout=300)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List the files."}]
    r1 = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=[BASH], tool_choice="required",
                                        max_tokens=200)
    calls = r1.choices[0].message.tool_calls
    assert calls, r1.choices[0].message
    msgs += _tool_turn(calls)
    r2 = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=[BASH], tool_choice="none",
                                        max_tokens=24)
    answer = r2.choices[0].message.content
    assert answer, f"seed_per_call={SEED} no longer draws a turn-2 answer with text: pick another SEED"
    msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks. And now?"}]
    client.chat.completions.create(model="gpt-4o", messages=msgs, tools=[BASH], tool_choice="none", max_tokens=24)

    recs = [r for r in gw.records() if r["session"] == "exact-s1"]
    assert len(recs) == 3
    assert recs[1]["exact"]["path"] == "exact", recs[1]["exact"]
    assert recs[2]["exact"]["path"] == "exact", recs[2]["exact"]
    truth = [x.truth() for x in relay.chats() if (x.json() or {}).get("max_tokens") != 1][-3:]
    for r, t in zip(recs, truth):
        assert _ids(r["prompt_token_ids"]) == t.prompt_token_ids
        assert _ids(r["completion_token_ids"]) == t.completion_ids
    for a, b in zip(truth, truth[1:]):
        assert b.prompt_token_ids[:len(a.prompt_token_ids) + len(a.completion_ids)] == \
            a.prompt_token_ids + a.completion_ids

    out = base / "out"
    assert polar_process([gw.flows_dir, "-o", str(out), "-q", "--overwrite", "--tokenizer",
                          os.path.join(ROOT, ".cache", "models", "tiny")]) == 0
    report = json.loads((out / "report.json").read_text())
    seqs = pl.read_parquet(out / "sequences.parquet").filter(pl.col("session") == "exact-s1")
    assert [b for b in report["breaks"] if b["session"] == "exact-s1"] == []
    assert seqs.height == 1 and "context_mismatch" not in seqs["flags"][0].to_list()
    assert seqs["input_ids"][0].to_list() == truth[-1].prompt_token_ids + truth[-1].completion_ids


def _turn(gw, msgs, **kwargs):
    client = openai_sdk(gw, "exact-restart", api_key="sk", timeout=300)
    return client.chat.completions.create(model="gpt-4o", messages=msgs, tools=[BASH], **kwargs).choices[0].message


def test_1_3_a_restart_between_turns_keeps_turn_three_exact(tmp_path):
    server = shared_vllm("tiny")
    sets = ["polar_exact=true", SAMPLING]
    flows = str(tmp_path / "flows")
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List the files."}]
    with RecordingRelay(server.root_url) as relay:
        with start_gateway(relay.base_url, str(tmp_path / "run1"), flows, sets=sets) as gw:
            calls = _turn(gw, msgs, tool_choice="required", max_tokens=200).tool_calls
            assert calls
            msgs += _tool_turn(calls)
            answer = _turn(gw, msgs, tool_choice="none", max_tokens=24).content
            assert answer, f"seed_per_call={SEED} no longer draws a turn-2 answer with text: pick another SEED"
            eot = int(re.search(r"end-of-turn id (\d+)", gw.log_text()).group(1))
        msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And now?"}]
        since = relay.mark()
        with start_gateway(relay.base_url, str(tmp_path / "run2"), flows, sets=sets) as gw:
            _turn(gw, msgs, tool_choice="none", max_tokens=24)
            assert "takes prompt token ids" in gw.log_text()
        sent = [x for x in relay.chats(since) if (x.json() or {}).get("max_tokens") != 1][-1]
    recs = [r for _, _, r in rec.iter_files(rec.expand_inputs([flows])) if r["session"] == "exact-restart"]
    assert len(recs) == 3
    third = recs[2]["exact"]
    assert third["fallback_reason"] != "no_parent" and third["rebuild"]["turns"] == 2, third
    assert third["path"] == "exact" and third["parent"] == recs[1]["id"], third
    p2, c2 = _ids(recs[1]["prompt_token_ids"]), _ids(recs[1]["completion_token_ids"])
    body = sent.json()
    doc = httpx.post(server.root_url + "/tokenize", json=tokenize_request(body["model"], chat=body), trust_env=False,
                     timeout=120)  # the canonical render of turn 3, asked as the gateway asks it
    canonical, got = doc.json()["tokens"], sent.truth().prompt_token_ids
    assert got == _ids(recs[2]["prompt_token_ids"])  # the record holds what vLLM was really sent
    # The oracle, without the code under test (exact.splice): turn 2's prompt and sampled ids unchanged, closed by
    # the end-of-turn id, then the canonical render's own tail, which starts right after one of its end-of-turn ids
    # and holds the new user message and nothing of the earlier ones.
    base = p2 + c2 + ([] if c2 and c2[-1] == eot else [eot])
    assert got[:len(base)] == base
    tail = got[len(base):]
    assert tail and canonical[len(canonical) - len(tail):] == tail and canonical[-len(tail) - 1] == eot
    text = httpx.post(server.root_url + "/detokenize", json={"model": body["model"], "tokens": tail},
                      trust_env=False, timeout=120).json()["prompt"]
    assert text.count("And now?") == 1 and "a.txt b.txt" not in text and "List the files." not in text, text
    assert len(answer.strip()) < 3 or answer.strip() not in text, (answer, text)  # nor turn 2's own answer
