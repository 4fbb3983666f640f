"""Scenarios for the trainer's columns (docs/merge-rules.md#outputs): calls.parquet's sampling values, logprobs mode and
weight version; sequences.parquet's weight_versions, call_spans and the mixed_weight_versions flag.

1.x  calls columns, from the record (normalize.py)
2.x  sequence columns, from the merge (merge.py)
3.x  end to end through polar-process, with --incremental carrying them over
"""

from __future__ import annotations

import json

import numpy as np
import orjson
import polars as pl
import pytest

from polar.processor.cli import main
from polar.processor.merge import merge_group
from polar.processor.normalize import to_call
from polar.processor.writers import CALLS_SCHEMA, SEQUENCES_SCHEMA
from tests.processor.calls import EOT, eot_for, record
from tests.processor.synth import session_records, write_flows

pytestmark = pytest.mark.unit

P1 = [1, 9, 9, 5]
C1 = [20, 21, EOT]
P2 = P1 + C1 + [6, 30, EOT, 5]
C2 = [22, EOT]
P3 = P2 + C2 + [6, 31, 32, EOT, 5]
C3 = [23, 24, 25, EOT]


def versioned(prompt, completion, version, **kw):
    r = record(prompt, completion, **kw)
    r["weight_version"] = version
    return to_call(r, "mem", 0)


# ---------------------------------------------------------------------------------------------------- 1. calls

def test_1_1_sampling_comes_from_the_record_s_sampling_map():
    r = record(P1, C1, body=orjson.dumps({"messages": [], "temperature": 0.2, "top_p": 0.5, "top_k": 3}))
    r["sampling"] = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "logprobs_mode": "processed_logprobs"}
    r["weight_version"] = "step-3"
    row = to_call(r, "mem", 0).row
    assert (row["temperature"], row["top_p"], row["top_k"]) == (0.7, 0.9, 20)
    assert row["logprobs_mode"] == "processed_logprobs" and row["weight_version"] == "step-3"


def test_1_2_without_a_sampling_map_the_upstream_body_says_what_was_sent():
    r = record(P1, C1, body=orjson.dumps({"messages": [], "temperature": 0.5, "top_k": -1}))
    r.pop("weight_version", None)  # an older record: the field is absent, not nil
    row = to_call(r, "mem", 0).row
    assert (row["temperature"], row["top_p"], row["top_k"]) == (0.5, None, -1)
    assert row["logprobs_mode"] is None and row["weight_version"] is None


def test_1_3_the_backend_map_answers_the_logprobs_mode_when_sampling_does_not():
    r = record(P1, C1)
    r["sampling"] = {"temperature": 1.0}
    r["backend"] = {"kind": "vllm", "version": "0.32", "logprobs_mode": "raw_logprobs"}
    assert to_call(r, "mem", 0).row["logprobs_mode"] == "raw_logprobs"


@pytest.mark.parametrize("sampling,version", [
    ({"temperature": "hot", "top_p": [1], "top_k": True, "logprobs_mode": 3}, 7),
    ("not a map", b"v1"),
])
def test_1_4_odd_values_become_nulls(sampling, version):
    r = record(P1, C1)
    r["sampling"], r["weight_version"] = sampling, version
    row = to_call(r, "mem", 0).row
    assert [row[k] for k in ("temperature", "top_p", "top_k", "logprobs_mode", "weight_version")] == [None] * 5


# ---------------------------------------------------------------------------------------------------- 2. sequences

def merged(calls, mode="prefix_merging"):
    return merge_group(calls, mode=mode, eot_for=eot_for)


@pytest.mark.parametrize("versions,want,mixed", [
    (["v1", "v1", "v1"], ["v1"], False),
    (["v1", "v2", "v1"], ["v1", "v2"], True),  # distinct, in call order
    ([None, "v1", None], ["v1"], False),  # unknown versions are no evidence of a second policy
    ([None, None, None], [], False),
])
def test_2_1_weight_versions_are_the_distinct_versions_and_more_than_one_is_flagged(versions, want, mixed):
    calls = [versioned(p, c, v) for (p, c), v in zip([(P1, C1), (P2, C2), (P3, C3)], versions)]
    (seq,) = merged(calls).sequences
    assert seq.weight_versions == want
    assert ("mixed_weight_versions" in seq.flags) is mixed


def test_2_2_call_spans_hold_each_call_s_completion_and_cover_the_mask():
    calls = [versioned(p, c, "v1") for p, c in [(P1, C1), (P2, C2), (P3, C3)]]
    (seq,) = merged(calls).sequences
    assert [s[0] for s in seq.call_spans] == [c.id for c in calls]
    for (_, start, end), c in zip(seq.call_spans, calls):
        assert seq.input_ids[start:end].tolist() == c.completion.tolist()
        assert seq.logprobs[start:end].tolist() == c.logprobs.tolist()
    assert seq.call_spans[0][1] == seq.prompt_len and seq.call_spans[-1][2] == seq.n_tokens
    covered = np.zeros(seq.n_tokens, dtype=np.uint8)
    for _, start, end in seq.call_spans:
        covered[start:end] = 1
    assert covered.tolist() == seq.loss_mask.tolist()


def test_2_3_per_request_spans_are_the_whole_completion():
    calls = [versioned(P1, C1, "v1"), versioned(P2, C2, "v2")]
    seqs = merged(calls, mode="per_request").sequences
    assert [s.call_spans for s in seqs] == [[(calls[0].id, len(P1), len(P1 + C1))],
                                            [(calls[1].id, len(P2), len(P2 + C2))]]
    assert all("mixed_weight_versions" not in s.flags for s in seqs)


def test_2_4_a_break_splits_versions_with_the_calls():
    a, b = versioned(P1, C1, "v1", model="m1"), versioned(P2, C2, "v2", model="m2")  # model_changed: a break
    seqs = merged([a, b]).sequences
    assert [s.weight_versions for s in seqs] == [["v1"], ["v2"]]
    assert seqs[1].call_spans == [(b.id, len(P2), len(P2 + C2))]


# ---------------------------------------------------------------------------------------------------- 3. end to end

def _dump(directory, versions_by_session: dict[str, list[str | None]], seed: int = 0) -> list[dict]:
    recs = []
    for i, (session, versions) in enumerate(versions_by_session.items()):
        rs = session_records(session, ["turn"] * len(versions), seed=seed + i, t0=1_700_000_000.0 + 100 * i)
        for r, v in zip(rs, versions):
            r["weight_version"] = v
            r["sampling"] = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "logprobs_mode": "raw_logprobs"}
        recs += rs
    write_flows(str(directory), recs)
    return recs


def test_3_1_polar_process_writes_the_columns_with_the_contract_dtypes(tmp_path):
    recs = _dump(tmp_path / "flows", {"a": ["v1", "v2", "v2"], "b": ["v1", None]})
    assert main([str(tmp_path / "flows"), "-o", str(tmp_path / "out"), "-q"]) == 0
    calls = pl.read_parquet(tmp_path / "out" / "calls.parquet")
    seqs = pl.read_parquet(tmp_path / "out" / "sequences.parquet")
    assert dict(calls.schema) == CALLS_SCHEMA and dict(seqs.schema) == SEQUENCES_SCHEMA
    by_id = {r["call_id"]: r for r in calls.iter_rows(named=True)}
    assert [by_id[r["id"]]["weight_version"] for r in recs] == [r["weight_version"] for r in recs]
    assert {(r["temperature"], r["top_p"], r["top_k"], r["logprobs_mode"]) for r in by_id.values()} == {
        (0.8, 0.95, 40, "raw_logprobs")}
    rows = {r["session"]: r for r in seqs.iter_rows(named=True)}
    assert rows["a"]["weight_versions"] == ["v1", "v2"] and "mixed_weight_versions" in rows["a"]["flags"]
    assert rows["b"]["weight_versions"] == ["v1"] and "mixed_weight_versions" not in rows["b"]["flags"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["flags"]["mixed_weight_versions"] == 1
    for r in rows.values():
        ids = r["input_ids"]
        assert [s["call_id"] for s in r["call_spans"]] == r["call_ids"]
        for s in r["call_spans"]:
            comp = by_id[s["call_id"]]
            assert s["end"] - s["start"] == comp["completion_tokens"]
            assert all(m == 1 for m in r["loss_mask"][s["start"]:s["end"]]) and s["end"] <= len(ids)


def test_3_2_incremental_carries_the_columns_over_unchanged(tmp_path):
    _dump(tmp_path / "flows", {"a": ["v1", "v2"], "b": ["v3"]})
    out = tmp_path / "out"
    assert main([str(tmp_path / "flows"), "-o", str(out), "-q"]) == 0
    before = pl.read_parquet(out / "sequences.parquet").filter(pl.col("session") == "a")
    _dump(tmp_path / "flows", {"c": ["v4"]}, seed=50)  # a new closed file: only session c is rebuilt
    assert main([str(tmp_path / "flows"), "-o", str(out), "-q", "--incremental"]) == 0
    after = pl.read_parquet(out / "sequences.parquet")
    carried = after.filter(pl.col("session") == "a")
    assert carried.select("weight_versions", "call_spans", "flags").equals(
        before.select("weight_versions", "call_spans", "flags"))
    assert after.filter(pl.col("session") == "c")["weight_versions"].to_list() == [["v4"]]
