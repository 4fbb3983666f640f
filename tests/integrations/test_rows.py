"""polar.integrations.rows on a hand-built processed RUN: the row of a sample is the sequence holding its session's
last call (the others left out and named), split at the first prompt; the latest attempt is the highest; a sample
without a sequence is one pad token with mask 0 and no reward; a context_mismatch sequence is masked whole and a
constrained call's tokens are masked, each counted — nothing silently dropped."""

from __future__ import annotations

import json

import polars as pl

from polar.integrations.rows import read_rows
from polar.processor.writers import CALLS_SCHEMA, SEQUENCES_SCHEMA

PAD = 0


def seq(sid, session, ids, mask, lps, prompt_len, calls, spans, flags=()):
    return {"sequence_id": sid, "chain_id": sid, "session": session, "group": "g", "mode": "exact",
            "input_ids": ids, "loss_mask": mask, "logprobs": [float(x) for x in lps], "call_ids": calls, "n_calls": len(calls),
            "n_tokens": len(ids), "n_trainable": sum(mask), "prompt_len": prompt_len, "flags": list(flags),
            "break_cause": None, "model": "tiny", "reward": None, "advantage": None, "weight_versions": ["trl-0"],
            "call_spans": [{"call_id": c, "start": a, "end": b} for c, a, b in spans]}


def call(cid, session, t, constrained=False, completion=2):
    row = dict.fromkeys(CALLS_SCHEMA)
    row.update(call_id=cid, session=session, t_start=t, completion_tokens=completion, temperature=1.0, top_p=1.0,
               top_k=-1, logprobs_mode="raw_logprobs", weight_version="trl-0", constrained=constrained)
    return row


def test_rows_of_a_processed_run(tmp_path):
    run = tmp_path / "run"
    (run / "out").mkdir(parents=True)
    results = [  # (task, k) → the highest attempt wins, whatever the line order
        {"task": "t", "k": 0, "attempt": 2, "session": "r/t/0/2", "status": "completed", "reward": 0.5},
        {"task": "t", "k": 0, "attempt": 1, "session": "r/t/0/1", "status": "infra_error", "reward": None},
        {"task": "t", "k": 1, "attempt": 1, "session": "r/t/1/1", "status": "infra_error", "reward": None},
        {"task": "t", "k": 2, "attempt": 1, "session": "r/t/2/1", "status": "completed", "reward": 1.0},
        {"task": "t", "k": 3, "attempt": 1, "session": "r/t/3/1", "status": "completed", "reward": 0.0},
    ]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results) + '{"torn')
    seqs = [
        # session r/t/0/2: a compaction broke it into two sequences; the second holds the last call
        seq("A", "r/t/0/2", [5, 6, 7, 8, 9], [0, 0, 1, 1, 0], [0, 0, -0.1, -0.2, 0], 2, ["c1"], [("c1", 2, 4)]),
        seq("B", "r/t/0/2", [5, 6, 40, 41, 42, 43], [0, 0, 0, 1, 1, 1], [0, 0, 0, -0.3, -0.4, -0.5], 3, ["c2", "c3"],
            [("c2", 3, 4), ("c3", 4, 6)]),
        seq("C", "r/t/2/1", [5, 6, 7, 8], [0, 0, 1, 1], [0, 0, -0.1, -0.1], 2, ["c4"], [("c4", 2, 4)],
            flags=["context_mismatch"]),
        seq("D", "r/t/3/1", [5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 1, 1], [0, 0, -1, -1, -2, -2], 2, ["c5", "c6"],
            [("c5", 2, 4), ("c6", 4, 6)]),
    ]
    pl.DataFrame(seqs, schema=SEQUENCES_SCHEMA).write_parquet(run / "out" / "sequences.parquet")
    calls = [call("c1", "r/t/0/2", 1.0), call("c2", "r/t/0/2", 2.0, completion=1), call("c3", "r/t/0/2", 3.0),
             call("c4", "r/t/2/1", 1.0), call("c5", "r/t/3/1", 1.0), call("c6", "r/t/3/1", 2.0, constrained=True)]
    pl.DataFrame(calls, schema=CALLS_SCHEMA).write_parquet(run / "out" / "calls.parquet")

    got = read_rows(run, PAD)
    split = got.rows[("t", 0)]
    assert (split.sequence_id, split.session, split.reward, split.status) == ("B", "r/t/0/2", 0.5, "completed")
    assert split.prompt_ids == [5, 6, 40] and split.completion_ids == [41, 42, 43]
    assert split.env_mask == [1, 1, 1] and split.logprobs == [-0.30000001192092896, -0.4000000059604645, -0.5]
    assert got.left_out == ["A"] and got.counts["sequences_left_out"] == 1

    missing = got.rows[("t", 1)]
    assert (missing.prompt_ids, missing.completion_ids, missing.env_mask, missing.reward) == ([PAD], [PAD], [0], None)
    assert got.counts["no_sequence"] == 1 and got.counts["unrewarded"] == 1

    mismatch = got.rows[("t", 2)]
    assert mismatch.env_mask == [0, 0] and mismatch.completion_ids == [7, 8] and got.counts["mismatch_masked"] == 1

    constrained = got.rows[("t", 3)]
    assert constrained.env_mask == [1, 1, 0, 0] and constrained.completion_ids == [7, 8, 9, 10]
    assert got.counts["constrained_calls_left_out"] == 1 and got.counts["constrained_tokens_left_out"] == 2
    assert constrained.reward == 0.0  # a reward of 0 stays 0; only no reward is None


def test_an_out_processed_with_turn_credit_is_refused_in_one_line(tmp_path):
    import pytest

    from polar.integrations.rows import RowsError

    run = tmp_path / "run"
    (run / "out").mkdir(parents=True)
    (run / "results.jsonl").write_text("")
    (run / "out" / "manifest.json").write_text(json.dumps({"credit": "turn"}))
    with pytest.raises(RowsError, match="--credit turn") as caught:
        read_rows(run, PAD)
    assert "\n" not in str(caught.value)
    (run / "out" / "manifest.json").write_text(json.dumps({"credit": "session"}))
    assert read_rows(run, PAD).rows == {}


def test_an_out_of_a_newer_version_is_refused_in_one_line(tmp_path):
    """The rows read OUT through polar.records.out: a sequences.parquet stamped with a version this polar does not
    know is refused in one line, never read as if it were this one's."""
    import pytest

    from polar.records import out as out_tables

    run = tmp_path / "run"
    (run / "out").mkdir(parents=True)
    (run / "results.jsonl").write_text(json.dumps({"task": "t", "k": 0, "attempt": 0, "session": "r/t/0/0",
                                                   "status": "completed", "reward": 1.0}) + "\n")
    row = seq("A", "r/t/0/0", [5, 6, 7], [0, 1, 1], [0, -0.1, -0.2], 1, ["c1"], [("c1", 1, 3)])
    pl.DataFrame([row], schema=SEQUENCES_SCHEMA).write_parquet(
        run / "out" / "sequences.parquet", metadata={out_tables.VERSION_KEY: str(out_tables.VERSION + 1)})
    with pytest.raises(out_tables.OutVersionError, match="update polar") as caught:
        read_rows(run, PAD)
    assert "\n" not in str(caught.value)
