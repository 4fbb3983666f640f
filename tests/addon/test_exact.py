"""Exact mode's pure parts (addon/exact.py) and the compact prompt form (record.PromptResolver), no sockets.

1.x  message comparison: tool-call ids ignored, arguments as parsed JSON, dropped reasoning allowed, edits caught
2.x  parent search: deepest prefix wins; model/tools/template settings must be equal
3.x  splice: sampled ids kept verbatim, end-of-turn added after a cut turn, tail after the same eot count, drift
4.x  the probe's end-of-turn detection
5.x  the cache bounds (turns per session, sessions, bytes)
6.x  compact form: written only when the prompt starts with the parent's prompt; the reader and the processor's
     session loader rebuild it, across files
7.x  prepare() against a mocked backend: every failure is a fallback reason, never an exception
8.x  the rebuild after a restart (docs/architecture.md#exact-mode): the same turns from the flow files, so the same
     splice; bounded, incremental, once per session; bad files skipped and counted; unreadable records are
     rebuild_failed
"""

from __future__ import annotations

import array
import asyncio
import time

import httpx
import orjson
import pytest

from polar.addon import exact as ex
from polar.addon.exact_cache import CachedTurn, MsgKey, TurnCache, find_parent, has_media, settings_key
from polar.addon.exact_probe import ProbeResult, end_of_turn
from polar.addon.exact_rebuild import INDEX_FIELDS, may_be_cached
from polar import records as rec
from polar.addon.backend import Backend
from polar.addon.shaping import BackendInfo, Shaped, shape
from polar.addon.turn_index import PassStats, ReadStats, TurnIndex

pytestmark = pytest.mark.unit

EOT = 2


def _call(name, args, id_="call_1"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def _turn(id_, messages, reply, prompt, completion, key=b"k"):
    return CachedTurn(id_, key, [MsgKey.of(m) for m in messages], MsgKey.of(reply),
                         array.array("i", prompt), array.array("i", completion))


USER = {"role": "user", "content": "hi"}
REPLY = {"role": "assistant", "content": "Sure. ", "reasoning_content": "think",
         "tool_calls": [_call("bash", '{"command": "ls", "n": 1}')]}


@pytest.mark.parametrize("new,ok", [
    ({"role": "assistant", "content": "Sure.", "tool_calls": [_call("bash", '{"n":1,"command":"ls"}', "other")]}, True),
    ({"role": "assistant", "content": [{"type": "text", "text": "Sure."}], "reasoning_content": "think",
      "tool_calls": [_call("bash", '{"command":"ls","n":1}')]}, True),
    ({"role": "assistant", "content": "Sure.", "reasoning_content": "other thoughts",
      "tool_calls": [_call("bash", '{"command":"ls","n":1}')]}, False),
    ({"role": "assistant", "content": "Sure.", "tool_calls": [_call("bash", '{"command":"rm"}')]}, False),
    ({"role": "assistant", "content": "Not sure.", "tool_calls": [_call("bash", '{"command":"ls","n":1}')]}, False),
])
def test_1_1_message_comparison(new, ok):
    assert MsgKey.of(REPLY).matches(MsgKey.of(new)) is ok


def test_1_2_media_is_detected():
    assert has_media([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert not has_media([{"role": "user", "content": [{"type": "text", "text": "x"}]}, USER])


def test_2_1_deepest_parent_wins_and_settings_must_match():
    m2 = [USER, REPLY, {"role": "tool", "tool_call_id": "call_1", "content": "a"}]
    t1 = _turn("t1", [USER], REPLY, [1, 5, 2], [7, 2])
    t2 = _turn("t2", m2, {"role": "assistant", "content": "done"}, [1, 5, 2, 7, 2, 9, 2], [8, 2])
    new = [MsgKey.of(m) for m in m2 + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "?"}]]
    assert find_parent([t2, t1], b"k", new) is t2
    assert find_parent([t1], b"k", new) is t1
    assert find_parent([t1, t2], b"other-tools", new) is None
    edited = [MsgKey.of(m) for m in [{"role": "user", "content": "changed"}, REPLY, m2[2]]]
    assert find_parent([t1, t2], b"k", edited) is None
    assert find_parent([t1], b"k", [MsgKey.of(USER)]) is None  # no reply in the new history


def test_2_2_settings_key_covers_model_tools_and_template_kwargs():
    body = {"tools": [{"type": "function", "function": {"name": "a"}}], "chat_template_kwargs": {"x": 1}}
    assert settings_key("m", body) == settings_key("m", dict(body))
    assert settings_key("m", body) != settings_key("n", body)
    assert settings_key("m", body) != settings_key("m", {**body, "chat_template_kwargs": {"x": 2}})
    assert settings_key("m", body) != settings_key("m", {"chat_template_kwargs": {"x": 1}})


def test_3_1_splice_keeps_sampled_ids_and_takes_the_canonical_tail():
    prompt, completion = [1, 10, 2, 3, 1, 11, 3], [40, 41, 42, EOT]  # sampled "abc" as 3 ids
    canonical = [1, 10, 2, 3, 1, 11, 3, 99, EOT, 3, 1, 12, 2, 3, 1, 11, 3]  # re-rendered "abc" as one id
    s = ex.splice(prompt, completion, canonical, EOT)
    assert s.ids == prompt + completion + [3, 1, 12, 2, 3, 1, 11, 3]
    assert (s.splice_pos, s.eot_count, s.render_len, s.canonical_pos) == (11, 2, 17, 9)
    assert s.drift == 2 + 2  # aligned from the start: 2 positions differ, and the render is 2 shorter


def test_3_2_a_turn_without_end_of_turn_gets_the_templates():
    s = ex.splice([1, 10, 2, 3], [40, 41], [1, 10, 2, 3, 40, 41, EOT, 3, 1, 12, EOT], EOT)
    assert s.ids == [1, 10, 2, 3, 40, 41, EOT, 3, 1, 12, EOT] and s.drift == 0 and s.splice_pos == 7


def test_3_3_boundary_not_found():
    with pytest.raises(ex.NoBoundary):
        ex.splice([1, 2], [5, EOT], [1, 2, 5], EOT)  # only one eot in the render, two needed
    with pytest.raises(ex.NoBoundary):
        ex.splice([1, 2], [5, EOT], [1, 2, 5, EOT], EOT)  # nothing after the boundary


def test_4_1_end_of_turn_detection():
    word = [56, 57]
    one = [1, 8, 56, 57, 2, 9]
    three = one + [1, 7, 56, 57, 2, 9] + one
    assert end_of_turn(one, three, word) == 2
    assert end_of_turn([1, 8, 56, 57], [1, 8, 56, 57] * 3, word) is None


def test_5_1_cache_bounds():
    c = TurnCache(max_sessions=2, max_turns=2, max_bytes=10_000)
    for i in range(3):
        c.add("a", _turn(f"a{i}", [USER], REPLY, [1] * 10, [2]))
    assert [t.id for t in c.turns("a")] == ["a1", "a2"]
    c.add("b", _turn("b0", [USER], REPLY, [1], [2]))
    c.turns("a")  # touch: b is now the least recently used
    c.add("c", _turn("c0", [USER], REPLY, [1], [2]))
    assert list(c.sessions) == ["a", "c"]
    c.add("c", _turn("big", [USER], REPLY, [1] * 3000, [2]))
    assert c.nbytes <= 10_000 + 13_000 and "a" not in c.sessions  # older sessions go first
    assert c.nbytes == sum(t.nbytes for ts in c.sessions.values() for t in ts)


def _record(id_, prompt, completion, **extra):
    r = {name: None for name in rec.FIELDS}
    r.update(v=rec.VERSION, id=id_, session="s", t_start=float(len(id_)), prompt_token_ids=rec.pack_ids(prompt),
             completion_token_ids=rec.pack_ids(completion), **extra)
    return r


def test_6_1_compact_form_round_trip_across_files(tmp_path):
    parent = _turn("p1", [USER], REPLY, [1, 5, 2, 3], [7, 8, EOT])
    full = [1, 5, 2, 3, 7, 8, EOT, 3, 1, 9, 2]
    r1 = _record("p1", [1, 5, 2, 3], [7, 8, EOT])
    r2 = _record("p22", full, [4, EOT])
    ex.compact(r2, full, parent)
    assert r2["prompt_ref"] == {"id": "p1", "len": 7} and r2["prompt_token_ids"] is None
    assert rec.unpack_ids(r2["prompt_tail_ids"]) == [3, 1, 9, 2]
    # a third turn referencing a compact one
    p2 = _turn("p22", [USER], REPLY, full, [4, EOT])
    r3 = _record("p333", full + [4, EOT, 3, 6], [EOT])
    ex.compact(r3, full + [4, EOT, 3, 6], p2)
    w = rec.FlowWriter(str(tmp_path), rotate_mb=256, min_free_mb=0)
    w.write(r1)
    w.close()
    w = rec.FlowWriter(str(tmp_path), rotate_mb=256, min_free_mb=0)
    w.write(r2)
    w.write(r3)
    w.close()
    files = rec.expand_inputs([str(tmp_path)])
    assert len(files) == 2
    got = {r["id"]: rec.unpack_ids(r["prompt_token_ids"]) for _, _, r in rec.iter_files(files)}
    assert got == {"p1": [1, 5, 2, 3], "p22": full, "p333": full + [4, EOT, 3, 6]}
    # one file alone cannot resolve a reference into another: nil, never invented
    alone = [r for _, r in rec.iter_file(files[1])]
    assert alone[0]["prompt_token_ids"] is None
    # the processor loads one session at a time and rebuilds there
    from polar.processor.load import RecordSource, build_index

    index = build_index([str(tmp_path)])
    source = RecordSource(index.files)
    loaded = {r["id"]: rec.unpack_ids(r["prompt_token_ids"]) for _, r in source.load(index.sessions()["s"])}
    source.close()
    assert loaded == got


def test_6_2_no_compact_form_when_the_prompt_does_not_start_with_the_parents():
    parent = _turn("p1", [USER], REPLY, [1, 5, 2], [7, EOT])
    r = _record("x", [1, 6, 2, 9], [EOT])
    ex.compact(r, [1, 6, 2, 9], parent)
    assert r["prompt_ref"] is None and rec.unpack_ids(r["prompt_token_ids"]) == [1, 6, 2, 9]
    ex.compact(r, [1, 5, 2, 7, 3], parent)  # part of the completion re-tokenized: the reference is cut there
    assert r["prompt_ref"] == {"id": "p1", "len": 4} and rec.unpack_ids(r["prompt_tail_ids"]) == [3]


def _Backend(handler) -> Backend:
    """The real backend client (its /tokenize and probe requests) over a mock transport."""
    backend = Backend("http://b/v1", "m", "vllm", None, 5.0)
    backend.client = httpx.AsyncClient(transport=httpx.MockTransport(handler), timeout=httpx.Timeout(5.0))
    return backend


def _shaped(messages):
    return Shaped({"model": "m", "messages": messages, "max_tokens": 50}, {"max_tokens": 50}, [])


def _final(shaped_draft, turn):
    """What the driver sends: shaping given exact mode's prompt ids (it clamps max_tokens to them)."""
    return shape({k: v for k, v in shaped_draft.body.items() if k != "model"}, backend=INFO, agent_top_logprobs=None,
                 logprobs_mode="raw_logprobs", sampling_override={}, thinking=None, thinking_kwarg=None,
                 prompt_ids=turn.sent)


INFO = BackendInfo("vllm", "0.32.0", "m", 64)


def _run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def test_7_1_prepare_splices_with_a_known_parent_and_falls_back_otherwise():
    mode = ex.ExactMode()
    mode.probes[("http://b/v1", "m", "0.32.0")] = ProbeResult(True, eot=EOT)
    canonical = [1, 10, 2, 3, 1, 40, EOT, 3, 1, 12, EOT, 3, 1, 11, 3]
    backend = _Backend(lambda req: httpx.Response(200, json={"tokens": canonical, "count": len(canonical)}))
    reply = {"role": "assistant", "content": "abc"}
    mode.cache.add("s", _turn("t1", [USER], reply, [1, 10, 2, 3, 1, 11, 3], [40, 41, 42, EOT],
                              key=settings_key("m", {})))
    shaped = _shaped([USER, reply, {"role": "user", "content": "more"}])
    turn = _run(mode.prepare(backend, INFO, shaped.body, "s"))
    assert turn.meta["path"] == "exact" and turn.meta["parent"] == "t1"
    assert turn.sent == [1, 10, 2, 3, 1, 11, 3, 40, 41, 42, EOT, 3, 1, 12, EOT, 3, 1, 11, 3]
    assert "kv_transfer_params" not in shaped.body  # prepare hands ids to shaping; it edits nothing
    final = _final(shaped, turn)
    assert final.body["kv_transfer_params"]["prompt_token_ids"] == turn.sent
    assert final.body["max_tokens"] == 64 - 19 and "max_tokens_clamped:50->45" in final.normalizations
    # other session: no parent; edited history: history_edited; same history in a session with other tools
    for session, messages, reason in [("t", shaped.body["messages"], "no_parent"),
                                      ("s", [USER, {"role": "assistant", "content": "xyz"}, USER], "history_edited")]:
        s2 = _shaped(messages)
        t = _run(mode.prepare(backend, INFO, s2.body, session))
        assert t.meta["fallback_reason"] == reason and t.sent is None


def test_7_2_backend_trouble_is_a_fallback_reason():
    mode = ex.ExactMode()
    key = ("http://b/v1", "m", "0.32.0")
    reply = {"role": "assistant", "content": "abc"}
    mode.cache.add("s", _turn("t1", [USER], reply, [1, 2], [40, EOT], key=settings_key("m", {})))
    messages = [USER, reply, {"role": "user", "content": "more"}]

    def down(req):
        raise httpx.ConnectError("refused")
    t = _run(mode.prepare(_Backend(down), INFO, _shaped(messages).body, "s"))
    assert t.meta["fallback_reason"] == "probe_error" and key not in mode.probes  # retried at the next call
    mode.probes[key] = ProbeResult(True, eot=EOT)
    t = _run(mode.prepare(_Backend(down), INFO, _shaped(messages).body, "s"))
    assert t.meta["fallback_reason"] == "render_failed" and t.meta["parent"] == "t1"
    few = _Backend(lambda req: httpx.Response(200, json={"tokens": [1, 2, 40, 7]}))
    assert _run(mode.prepare(few, INFO, _shaped(messages).body, "s")).meta["fallback_reason"] == "boundary_not_found"
    mode.probes[key] = ProbeResult(False, message="no")
    assert _run(mode.prepare(few, INFO, _shaped(messages).body, "s")).meta["fallback_reason"] == "mode_refused"


def test_7_3_finish_checks_the_echo_and_commit_caches():
    mode = ex.ExactMode()
    parent = _turn("t1", [USER], {"role": "assistant", "content": "a"}, [1, 2], [40, EOT])
    turn = ex.ExactTurn("s", b"k", [MsgKey.of(USER)], {"path": "exact", "fallback_reason": None}, parent,
                        sent=[1, 2, 40, EOT, 3])
    sent = orjson.dumps({"messages": [], "kv_transfer_params": {"prompt_token_ids": [1, 2, 40, EOT, 3]}})
    r = _record("t2", [1, 2, 40, EOT, 3], [5, EOT], upstream_request=sent, assistant={"content": "b"})
    mode.finish(turn, r, [1, 2, 40, EOT, 3])
    assert r["exact"]["path"] == "exact" and r["prompt_ref"] == {"id": "t1", "len": 4}
    assert orjson.loads(r["upstream_request"])["kv_transfer_params"]["prompt_token_ids"] == ex.ELIDED_IDS
    mode.commit(turn, r, [1, 2, 40, EOT, 3], [5, EOT], r["assistant"])
    assert [t.id for t in mode.cache.turns("s")] == ["t2"]
    r2 = _record("t3", [1, 2, 9], [5], upstream_request=b"{}")
    mode.finish(turn, r2, [1, 2, 9])
    assert r2["exact"]["fallback_reason"] == "echo_mismatch" and r2["upstream_request"] == b"{}"


def test_7_4_a_first_call_is_a_new_conversation_never_an_edit():
    """A history without an assistant turn has nothing to splice: `new_conversation`, whether or not the session
    already holds cached turns (a title or router side call, an earlier conversation under the same session id).
    `no_parent` stays the miss: earlier turns in the history, none cached. `history_edited` needs both."""
    mode = ex.ExactMode()
    mode.probes[("http://b/v1", "m", "0.32.0")] = ProbeResult(True, eot=EOT)
    backend = _Backend(lambda req: httpx.Response(500))  # never asked: no render happens on these paths
    reply = {"role": "assistant", "content": "abc"}
    mode.cache.add("s", _turn("t1", [USER], reply, [1, 10, 2], [40, EOT], key=settings_key("m", {})))
    system = {"role": "system", "content": "Be brief."}
    other = {"role": "user", "content": "a new task"}
    for session, messages, reason in [
        ("s", [other], "new_conversation"),              # the session has turns: this used to read history_edited
        ("s", [system, other], "new_conversation"),
        ("fresh", [other], "new_conversation"),          # nothing cached at all
        ("fresh", [other, reply, USER], "no_parent"),    # earlier turns this process never answered
        ("s", [other, reply, USER], "history_edited"),   # cached turns, none a prefix
    ]:
        shaped = _shaped(messages)
        t = _run(mode.prepare(backend, INFO, shaped.body, session))
        assert (t.meta["path"], t.meta["fallback_reason"], t.parent) == ("normal", reason, None), (session, messages)
        assert t.sent is None


# ---------------------------------------------------------------------------------------------------- 8.x rebuild
# After a restart the turn cache is rebuilt from the flow files (docs/architecture.md#exact-mode): the same turns, so
# the same splice.

def _toy_render(req):
    """A toy chat template behind a mock /tokenize: <s> role text-ids EOT \\n per message, then a generation prompt."""
    body = orjson.loads(req.content)
    ids = []
    for m in body["messages"]:
        ids += [1, {"system": 4, "user": 5, "assistant": 6, "tool": 7}[m["role"]]]
        ids += [100 + ord(ch) % 50 for ch in (m.get("content") or "")] + [EOT, 3]
    return httpx.Response(200, json={"tokens": ids + [1, 6], "count": len(ids) + 2})


BIG = BackendInfo("vllm", "0.32.0", "m", 4096)


def _shape(chat, **prompt):
    return shape(chat, backend=BIG, agent_top_logprobs=None, logprobs_mode="raw_logprobs", sampling_override={},
                 thinking=None, thinking_kwarg=None, **prompt)


def _mode(**cache):
    mode = ex.ExactMode(TurnCache(**cache) if cache else None)
    mode.probes[("http://b/v1", "m", "0.32.0")] = ProbeResult(True, eot=EOT)
    return mode


class _Live:
    """One proxy process, in the recorder's order: prepare → the backend echoes the ids → finish → write, commit."""

    def __init__(self, flows, mode=None, **cache):
        self.flows = str(flows)
        self.mode = mode or _mode(**cache)
        self.writer = rec.FlowWriter(self.flows, rotate_mb=256, min_free_mb=0)
        self.backend = _Backend(_toy_render)

    def call(self, session, messages, completion, reply, tools=None, error=None):
        chat = {"messages": messages, "max_tokens": 50, **({"tools": tools} if tools else {})}
        draft = _shape(chat)
        turn = _run(self.mode.prepare(self.backend, BIG, draft.body, session, flows=self.flows))
        final = _shape(chat, prompt_ids=turn.sent) if turn.sent is not None else draft
        prompt = turn.sent if turn.sent is not None else _toy_render(httpx.Request(
            "POST", "http://b/tokenize", content=orjson.dumps(draft.body))).json()["tokens"]
        r = rec.new_record(id=rec.uuid7(), session=session, upstream_request=orjson.dumps(final.body),
                           prompt_token_ids=rec.pack_ids(prompt), completion_token_ids=rec.pack_ids(completion),
                           assistant=reply, t_end=time.time(), error=error)
        self.mode.finish(turn, r, prompt)
        rec.validate(r)
        self.writer.write(r)
        self.mode.commit(turn, r, prompt, completion, reply)
        return turn, r

    def stop(self):
        self.writer.close()


def _entries(turns):
    return [(t.id, t.key, t.messages, t.reply, t.prompt.tolist(), t.completion.tolist()) for t in turns]


def _session(live, session, n, tools=None):
    """n turns of one conversation; returns the history after the last reply."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"}]
    for i in range(n):
        reply = {"content": f"ok{i} ", "reasoning": "hm" if i % 2 else None,
                 "tool_calls": [{"id": f"c{i}", "type": "function",
                                 "function": {"name": "bash", "arguments": f'{{"command": "ls", "n": {i}}}'}}]}
        live.call(session, [dict(m) for m in msgs], [60 + i, 61, 62, EOT], reply, tools=tools)
        msgs += [{"role": "assistant", "content": reply["content"], "reasoning_content": reply["reasoning"],
                  "tool_calls": [{"id": "other", "type": "function", "function": {
                      "name": "bash", "arguments": f'{{"n":{i},"command":"ls"}}'}}]},
                 {"role": "tool", "tool_call_id": "other", "content": f"out{i}"}]
    return msgs


TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def test_8_1_a_restart_rebuilds_exactly_the_turns_the_live_cache_held(tmp_path):
    flows = tmp_path / "flows"
    live = _Live(flows)
    msgs = _session(live, "s", 3, tools=TOOLS)
    _session(live, "other", 2)  # never read: another session
    kept = _entries(live.mode.cache.turns("s"))
    assert len(kept) == 3
    # the same next turn, without and with a restart
    without = live.call("s", msgs, [70, EOT], {"content": "done"}, tools=TOOLS)[0]
    live.stop()
    restarted = _Live(flows)
    turn = restarted.call("s", msgs, [70, EOT], {"content": "done"}, tools=TOOLS)[0]
    assert without.meta["path"] == turn.meta["path"] == "exact", (without.meta, turn.meta)
    assert turn.sent == without.sent and turn.meta["parent"] == without.meta["parent"] == kept[-1][0]
    assert {k: turn.meta[k] for k in ("splice_pos", "eot_count", "render_len", "drift")} == \
        {k: without.meta[k] for k in ("splice_pos", "eot_count", "render_len", "drift")}
    assert turn.meta["rebuild"]["records"] == 4 and turn.meta["rebuild"]["turns"] == 4  # "s" only, this call's too
    assert turn.meta["rebuild"]["skipped"] == 0 and turn.meta["rebuild"]["bad_files"] == 0
    # the cache now holds what the first process held (same ids, keys, messages, replies, token ids)
    assert _entries(restarted.mode.cache.turns("s"))[:4] == _entries(live.mode.cache.turns("s"))
    restarted.stop()


def test_8_2_the_rebuild_keeps_the_cache_bounds_and_runs_once_per_session(tmp_path):
    live = _Live(tmp_path, max_turns=3)
    msgs = _session(live, "s", 6)
    held = _entries(live.mode.cache.turns("s"))
    assert len(held) == 3
    restarted = _Live(tmp_path, max_turns=3)
    mode = restarted.mode
    turns, failure = _run(mode._rebuild("s", str(tmp_path), {}))
    assert failure is None and _entries(turns) == held and "s" in mode.cache.restored
    # a restored session misses for real: no second rebuild (history_edited, as without a restart)
    t = restarted.call("s", [msgs[0], {"role": "user", "content": "go"}, {"role": "assistant", "content": "??"},
                             {"role": "user", "content": "x"}], [EOT], {"content": ""})[0]
    assert t.meta["fallback_reason"] == "history_edited" and "rebuild" not in t.meta
    # a session nobody wrote: nothing read, still no_parent; evicted sessions are rebuilt again
    t = restarted.call("nobody", msgs, [EOT], {"content": ""})[0]
    assert t.meta["fallback_reason"] == "no_parent" and t.meta["rebuild"]["records"] == 0
    mode.cache.sessions.pop("s")
    mode.cache.restored.discard("s")
    assert _entries(_run(mode._rebuild("s", str(tmp_path), {}))[0]) == _entries(mode.cache.turns("s"))


def test_8_3_a_side_call_after_the_restart_does_not_hide_the_older_turns(tmp_path):
    """A title call in the same session is cached first after the restart; the continuation still finds its parent
    among the rebuilt turns (the side call stays cached, after them)."""
    live = _Live(tmp_path)
    msgs = _session(live, "s", 2)
    live.stop()
    restarted = _Live(tmp_path)
    side = restarted.call("s", [{"role": "user", "content": "title?"}], [80, EOT], {"content": "T"})[1]
    t = restarted.call("s", msgs, [EOT], {"content": "fine"})[0]
    assert t.meta["path"] == "exact" and t.meta["rebuild"]["turns"] == 3
    ids = [x.id for x in restarted.mode.cache.turns("s")]
    assert ids.index(side["id"]) == 2 and len(ids) == 4
    cache = restarted.mode.cache
    assert cache.nbytes == sum(x.nbytes for ts in cache.sessions.values() for x in ts)  # restore keeps the accounts


def test_8_4_the_index_reads_each_file_once_and_only_what_was_added(tmp_path):
    live = _Live(tmp_path)
    _session(live, "s", 2)
    live.call("s", [USER], [EOT], {"content": "x"}, error={"stage": "backend_stream", "status": 200,
                                                           "type": "unavailable", "message": "cut"})
    index = TurnIndex(str(tmp_path), INDEX_FIELDS, may_be_cached)
    first = index.refresh()
    assert (first.files_read, first.records_kept) == (1, 2) and index.count("s") == 2  # the failed call is not kept
    assert index.refresh().files_read == 0  # nothing new
    _session(live, "t", 1)
    again = index.refresh()
    assert (again.files_read, again.records_kept) == (1, 1) and again.bytes_read < first.bytes_read
    # closed by its writer between a listing and the read: found under its new name
    _session(live, "u", 1)
    live.stop()
    (f,) = index.files.values()
    assert f.is_open
    stats = PassStats()
    index._scan_listed(f, stats)
    assert stats.records_kept == 1 and f.done and index.count("u") == 1
    assert index.refresh().files_read == 0  # closed and read: never again


def test_8_5_corrupt_and_partial_files_are_skipped_counted_and_logged(tmp_path, caplog):
    live = _Live(tmp_path)
    msgs = _session(live, "s", 2)
    live.stop()
    (tmp_path / "flows-20260101T000000.000000Z-h-1-0001.msgpack").write_bytes(b"not msgpack at all")
    good = rec.pack(rec.new_record(id="x", session="s"))
    (tmp_path / "flows-20260101T000000.000000Z-h-2-0001.msgpack").write_bytes(good + good[:10])  # torn, closed
    (tmp_path / "flows-20260101T000000.000000Z-h-3-0001.msgpack.open").write_bytes(good[:10])  # being written
    restarted = _Live(tmp_path)
    with caplog.at_level("INFO", logger="polar.exact"):
        t = restarted.call("s", msgs, [EOT], {"content": "fine"})[0]
    assert t.meta["path"] == "exact" and t.meta["rebuild"]["bad_files"] == 2 and t.meta["rebuild"]["skipped"] == 0
    text = caplog.text
    assert "not a flow file" in text and "torn tail in a closed file" in text and "1 partial" in text


def test_8_6_records_that_cannot_be_read_back_are_rebuild_failed_never_an_exception(tmp_path):
    live = _Live(tmp_path)
    msgs = _session(live, "s", 2)
    live.stop()
    (path,) = rec.expand_inputs([str(tmp_path)])
    first_len = len(rec.pack(next(r for _, r in rec.iter_file(path, raw=True))))
    restarted = _Live(tmp_path)
    index = restarted.mode.indexes[str(tmp_path)] = TurnIndex(str(tmp_path), INDEX_FIELDS, may_be_cached)
    index.refresh()
    with open(path, "r+b") as fh:  # the first turn's bytes go bad after they were indexed
        fh.write(b"\xc1" * first_len)
    t = restarted.call("s", msgs, [EOT], {"content": "fine"})[0]
    assert t.meta["path"] == "normal" and t.meta["fallback_reason"] == "rebuild_failed"
    assert "could not be read back" in t.meta["detail"] and t.meta["rebuild"]["skipped"] == 2  # and its child
    assert "s" not in restarted.mode.cache.restored  # tried again at the next miss
    # a directory that cannot be listed: the same, with the error as the detail
    body = _shape({"messages": msgs}).body
    t = _run(restarted.mode.prepare(restarted.backend, BIG, body, "s", flows=str(tmp_path / "gone")))
    assert t.meta["fallback_reason"] == "rebuild_failed" and "FileNotFoundError" in t.meta["detail"]


def test_8_7_concurrent_misses_of_one_session_rebuild_it_once(tmp_path):
    live = _Live(tmp_path)
    msgs = _session(live, "s", 2)
    live.stop()
    mode = _mode()
    backend = _Backend(_toy_render)
    body = _shape({"messages": msgs}).body

    async def both():
        return await asyncio.gather(*(mode.prepare(backend, BIG, body, "s", flows=str(tmp_path)) for _ in range(2)))
    turns = _run(both())
    assert [t.meta["path"] for t in turns] == ["exact", "exact"] and turns[0].sent == turns[1].sent
    assert sum("rebuild" in t.meta for t in turns) == 1


def test_8_8_writers_interleave_by_end_time_each_in_its_own_order(tmp_path):
    def put(name, *records):
        (tmp_path / name).write_bytes(b"".join(rec.pack(r) for r in records))

    def r(id_, t_end):
        return rec.new_record(id=id_, session="s", t_end=t_end, exact={"splice_pos": None})
    put("flows-20260101T000000.000000Z-h-1-0001.msgpack", r("a1", 1.0), r("a2", 3.0))
    put("flows-20260101T000001.000000Z-h-1-0002.msgpack", r("a3", 2.5))  # its clock stepped back: still after a2
    put("flows-20260101T000000.500000Z-h-2-0001.msgpack", r("b1", 2.0), r("b2", 4.0))
    index = TurnIndex(str(tmp_path), INDEX_FIELDS, may_be_cached)
    index.refresh()
    got = [x["id"] for x in index.session_records("s", ReadStats())]
    assert got == ["a1", "b1", "a2", "a3", "b2"]
