"""Exact mode survives a proxy restart (docs/architecture.md#exact-mode): real mitmdump + TLS, the OpenAI SDK as the
agent, the scripted upstream with vLLM's tokens-in chat and a real tokenizer (tests/support/exact_upstream.py).

1.1  turns 1–2 of a tool session, the proxy restarted on the same flow directory, turn 3: the turn-3 record is
     spliced from the rebuilt turn cache (parent = turn 2, not no_parent), and its prompt ids — and the ids sent
     upstream — equal those of the same three turns through one proxy that never restarted
1.2  after the restart a side call of the same session (a first call, cached first) does not hide the older turns
"""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from polar import records as rec
from tests.support.exact_upstream import ExactUpstream
from tests.support.gateway import start_gateway
from tests.support.scripted_upstream import Reply
from tests.support.sdk import openai_sdk

pytestmark = pytest.mark.integration

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                        "required": ["command"]}}}


@pytest.fixture(scope="module")
def up(tokenizer_dir):
    with ExactUpstream(tokenizer_dir) as server:
        yield server


@contextlib.contextmanager
def _proxy(up, base):
    """A proxy in exact mode on `base`/flows, warmed up: the probe ran and a first call went through (with the
    upstream's default reply), so the test's scripted replies go to the test's own calls."""
    with start_gateway(up.base_url, str(base / "run"), str(base / "flows"), sets=["polar_exact=true"]) as gw:
        up.reset()
        openai_sdk(gw, "warmup").chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        up.reset()
        yield gw


def _records(flows_dir: str) -> list[dict]:
    """Every record, compact prompts rebuilt across files (the restarted proxy's turn 3 refers into the old file)."""
    return [r for _, _, r in rec.iter_files(rec.expand_inputs([flows_dir]))]


def _split(tok, text: str) -> list[int]:
    return [i for ch in text for i in tok.encode(ch)]  # deliberately non-canonical: one token per character


def _turns(up):
    """The scripted replies: a tool call with reasoning, an answer sampled as non-canonical ids, a last answer."""
    eot = up.tokenizer.token_to_id("<|im_end|>")
    return [Reply(reasoning="List it.", tool_calls=[("bash", {"command": "ls -la"})]),
            Reply(ids=_split(up.tokenizer, "Two files.") + [eot]), Reply(text="Bye.")]


def _history(msg) -> dict:
    out = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:  # re-serialized by the agent (compact JSON): compared as parsed JSON, still a parent
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": json.dumps(json.loads(c.function.arguments), separators=(",", ":"))}}
            for c in msg.tool_calls]
    return out


class _Agent:
    """One three-turn session, a turn at a time (the history carries over whichever proxy answers)."""

    def __init__(self):
        self.msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is here?"}]

    def turn(self, gw, session: str) -> None:
        r = openai_sdk(gw, session).chat.completions.create(model="gpt-4o", messages=self.msgs, tools=[BASH])
        msg = r.choices[0].message
        self.msgs.append(_history(msg))
        self.msgs.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "a\nb"} if msg.tool_calls
                         else {"role": "user", "content": "Thanks"})


def _session_records(flows_dir: str, session: str) -> list[dict]:
    return [r for r in _records(flows_dir) if r["session"] == session]


def test_1_1_turn_three_after_a_restart_is_spliced_as_without_one(up, tmp_path):
    # Without a restart: three turns through one proxy.
    agent = _Agent()
    with _proxy(up, tmp_path / "one") as gw:
        up.script(*_turns(up))
        for _ in range(3):
            agent.turn(gw, "s1")
        sent_once = up.chat_requests[-1].body["kv_transfer_params"]["prompt_token_ids"]
    once = _session_records(str(tmp_path / "one" / "flows"), "s1")
    # With a restart between turns 2 and 3, on the same flow directory.
    agent = _Agent()
    base = tmp_path / "two"
    with _proxy(up, base) as gw:
        up.script(*_turns(up)[:2])
        agent.turn(gw, "s1")
        agent.turn(gw, "s1")
    with _proxy(up, base) as gw:
        up.script(_turns(up)[2])
        agent.turn(gw, "s1")
        sent_twice = up.chat_requests[-1].body["kv_transfer_params"]["prompt_token_ids"]
        assert "rebuilt from 2 records: 2 turns, 0 skipped" in gw.log_text()
    twice = _session_records(str(base / "flows"), "s1")
    assert [r["exact"]["path"] for r in once] == [r["exact"]["path"] for r in twice] == ["normal", "exact", "exact"]
    third = twice[-1]["exact"]
    assert third["fallback_reason"] is None and third["parent"] == twice[1]["id"]
    assert third["rebuild"]["turns"] == 2 and third["rebuild"]["skipped"] == 0 and "rebuild" not in once[-1]["exact"]
    assert len({os.path.basename(p) for p in rec.expand_inputs([str(base / "flows")])}) == 2  # two processes' files
    assert sent_twice == sent_once
    for a, b in zip(once, twice):
        assert rec.unpack_ids(a["prompt_token_ids"]) == rec.unpack_ids(b["prompt_token_ids"])
        assert rec.unpack_ids(a["completion_token_ids"]) == rec.unpack_ids(b["completion_token_ids"])
    assert {k: once[-1]["exact"][k] for k in ("splice_pos", "eot_count", "render_len", "drift")} == \
        {k: third[k] for k in ("splice_pos", "eot_count", "render_len", "drift")}
    assert third["drift"] > 0  # the canonical render differs: only the sampled ids give this prompt


def test_1_2_a_side_call_after_the_restart_does_not_hide_the_older_turns(up, tmp_path):
    agent = _Agent()
    with _proxy(up, tmp_path) as gw:
        up.script(*_turns(up)[:2])
        agent.turn(gw, "s2")
        agent.turn(gw, "s2")
    with _proxy(up, tmp_path) as gw:
        up.script(Reply(text="A title"), _turns(up)[2])
        openai_sdk(gw, "s2").chat.completions.create(model="gpt-4o",
                                                      messages=[{"role": "user", "content": "Title this chat."}])
        agent.turn(gw, "s2")
    recs = _session_records(str(tmp_path / "flows"), "s2")
    assert [r["exact"]["fallback_reason"] for r in recs] == ["new_conversation", None, "new_conversation", None]
    assert recs[-1]["exact"]["parent"] == recs[1]["id"] and recs[-1]["exact"]["rebuild"]["turns"] == 3
