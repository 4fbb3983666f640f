"""Scenarios for processor/compaction.py and rule 12 in the merge (`--compaction train|mask`), on hand-made calls.

A session: two turns, then a compaction call X (the history plus a request to summarise; its completion a 24-id
summary), then B whose prompt is a new context holding the summary (its first id re-tokenised), then one more turn.

1.x  the rule: recognised by reappearance where the prefix broke; not an ordinary turn, not a short quote
2.x  the merge: the calls after the summary stay in the session's main lineage; train keeps X's tokens, mask zeroes
3.x  end to end: advantages on the summary (train) or none (mask), the flag and its events counted
"""

from __future__ import annotations

import numpy as np
import orjson
import polars as pl
import pytest

from polar.processor import compaction
from polar.processor.cli import main
from polar.processor.merge import merge_group
from polar.processor.normalize import to_call
from tests.processor.calls import EOT, eot_for, record
from tests.processor.synth import write_flows

pytestmark = pytest.mark.unit

SYS = [1, 9, 9, 9, 5]
P1 = SYS + [7, 11, 12, EOT, 5]
C1 = [20, 21, EOT]
P2 = P1 + C1 + [6, 30, EOT, 5]
C2 = [22, 23, EOT]
PX = P2 + C2 + [6, 31, EOT, 7, 99, 98, EOT, 5]  # a tool result, then the agent's "summarise" request
SUMMARY = list(range(300, 324))
CX = SUMMARY + [EOT]
PB = SYS + [7, 11, 12, EOT, 7, 497, 301 + 1000] + SUMMARY[2:] + [EOT, 5]  # the summary's first ids re-rendered
CB = [40, 41, EOT]
PC = PB + CB + [6, 32, EOT, 5]
CC = [42, EOT]


def _records(session="s", t0=1e9, summary_in_b=True):
    pb = PB if summary_in_b else SYS + [7, 11, 12, EOT, 7, 497, 498, EOT, 5]
    pc = pb + CB + [6, 32, EOT, 5]
    layout = [("c1", P1, C1), ("c2", P2, C2), ("x", PX, CX), ("b", pb, CB), ("c", pc, CC)]
    return [record(p, c, session=session, t=t0 + k, cid=f"{session}-{name}") for k, (name, p, c) in enumerate(layout)]


def _merged(mode="train", **kw):
    calls = [to_call(r, "mem", 0) for r in _records(**kw)]
    return merge_group(calls, mode="prefix_merging", eot_for=eot_for, compaction=mode)


def test_1_1_a_summary_reappearing_where_the_prefix_broke_is_recognised():
    comps = [np.array(c, np.int32) for c in (C1, C2, CX, CB, CC)]
    prompts = [np.array(p, np.int32) for p in (P1, P2, PX, PB, PC)]
    opens = [True, False, False, True, False]  # B extends no tip: it opened a chain
    assert compaction.find(comps, prompts, opens) == {2: 3}
    # The same reappearance in a prompt that extends the chain is an ordinary next turn, not a compaction.
    assert compaction.find(comps, prompts, [True, False, False, False, False]) == {}


def test_1_2_a_short_quote_is_no_summary():
    short = np.array(SUMMARY[:10] + [EOT], np.int32)
    later = np.array(SYS + SUMMARY[:10] + [EOT], np.int32)
    assert compaction.summary_core(short) is None
    assert compaction.find([short, np.array(CB, np.int32)], [np.array(P1, np.int32), later], [True, True]) == {}


def test_1_3_whole_ids_only():
    core = np.array([0x01020304] * 20, np.int32)
    shifted = np.frombuffer(b"\x00" + core.tobytes() + b"\x00\x00\x00", np.int32)  # the bytes, off by one byte
    assert not compaction._contains(shifted, core) and compaction._contains(np.concatenate([np.array([7], np.int32), core]), core)


def test_2_1_the_calls_after_the_summary_stay_in_the_main_lineage_and_train_keeps_the_summary():
    res = _merged("train")
    by_first = {s.call_ids[0]: s for s in res.sequences}
    x_seq = next(s for s in res.sequences if "s-x" in s.call_ids)
    assert "compaction" in x_seq.flags and not x_seq.side_chain
    after = by_first["s-b"]
    assert after.call_ids == ["s-b", "s-c"] and not after.side_chain and "side_chain" not in after.flags
    (_, start, end), = [sp for sp in x_seq.call_spans if sp[0] == "s-x"]
    assert x_seq.loss_mask[start:end].tolist() == [1] * len(CX)
    assert [(n.call_id, n.cause) for n in res.flag_notes if n.cause == "compaction"] == [("s-x", "compaction")]


def test_2_2_without_the_rule_the_calls_after_a_summary_would_be_a_side_chain():
    res = _merged("train", summary_in_b=False)  # B's prompt holds no summary: a new conversation, nothing joins it
    assert next(s for s in res.sequences if s.call_ids[0] == "s-b").side_chain
    assert not any("compaction" in s.flags for s in res.sequences)


def test_2_3_mask_sets_the_summary_tokens_to_mask_0_and_nothing_else():
    trained, masked = _merged("train"), _merged("mask")
    for t, m in zip(trained.sequences, masked.sequences):
        diff = np.flatnonzero(t.loss_mask != m.loss_mask)
        spans = {c: (a, b) for c, a, b in t.call_spans}
        if "s-x" in spans:
            a, b = spans["s-x"]
            assert diff.tolist() == list(range(a, b)) and not m.logprobs[a:b].any()
        else:
            assert not len(diff)


def _run(tmp_path, mode):
    flows = tmp_path / "flows"
    if not flows.exists():
        write_flows(str(flows), _records("s1", 1e9) + _records("s2", 2e9, summary_in_b=False))
        (tmp_path / "r.jsonl").write_text("\n".join(orjson.dumps(x).decode() for x in (
            {"session": "s1", "reward": 1.0, "group": "g"}, {"session": "s2", "reward": 0.0, "group": "g"})))
    out = tmp_path / mode
    assert main([str(flows), "-o", str(out), "--rewards", str(tmp_path / "r.jsonl"), "--compaction", mode,
                 "--side-chains", "zero", "-q"]) == 0
    return pl.read_parquet(out / "sequences.parquet"), orjson.loads((out / "report.json").read_bytes())


@pytest.mark.parametrize("mode", ["train", "mask"])
def test_3_1_end_to_end_the_summary_carries_the_session_s_advantage_or_none(tmp_path, mode):
    seqs, report = _run(tmp_path, mode)
    s1 = seqs.filter(pl.col("session") == "s1")
    x = s1.filter(pl.col("call_ids").list.contains("s1-x")).row(0, named=True)
    (span,) = [sp for sp in x["call_spans"] if sp["call_id"] == "s1-x"]
    summary = x["advantages"][span["start"]:span["end"]]
    assert summary == ([np.float32(x["advantage"])] * len(CX) if mode == "train" else [0.0] * len(CX))
    after = s1.filter(pl.col("sequence_id") == "s1-b").row(0, named=True)
    # --side-chains zero: a side chain would get 0.0; the calls after the summary carry the session's advantage
    assert after["advantage"] == 1.0 and "side_chain" not in after["flags"]
    assert report["flags"]["compaction"] == 1
    assert [e["call_id"] for e in report["flag_events"] if e["cause"] == "compaction"] == ["s1-x"]
    s2_after = seqs.filter(pl.col("sequence_id") == "s2-b").row(0, named=True)
    assert "side_chain" in s2_after["flags"] and s2_after["advantage"] == 0.0


def test_1_4_a_summary_after_reasoning_is_matched_by_its_tail():
    thinking, summary = list(range(700, 800)), list(range(300, 400))  # reasoning ids the agent never sends back
    completion = np.array(thinking + summary + [EOT], np.int32)
    later = np.array(SYS + [7, 497] + summary + [EOT, 5], np.int32)
    assert compaction.find([completion, np.array(CB, np.int32)], [np.array(PX, np.int32), later], [True, True]) \
        == {0: 1}
    assert compaction.summary_core(completion).tolist() == summary[-2 - compaction.TAIL:-2]
