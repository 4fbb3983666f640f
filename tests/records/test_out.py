"""OUT's tables as a contract (polar.records.out) and results.jsonl's one rule (polar.records.results), no sockets.

Scenarios: 1.x what polar-process writes · 2.x the rules · 3.x versions · 4.x results.jsonl's latest line.
"""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from polar.processor.cli import main as polar_process
from polar.records import out, results
from tests.processor.synth import session_records, write_flows

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def processed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("out")
    recs = session_records("s1", ["turn", "turn", "side", "retry", "trunc", "turn", "compact", "turn", "nolp"], seed=1)
    recs += session_records("s2", ["turn", "turn"], seed=2)
    write_flows(str(tmp / "flows"), recs, per_file=4)
    (tmp / "r.jsonl").write_text("\n".join(json.dumps(x) for x in [{"session": "s1", "reward": 1.0, "group": "g"},
                                                                     {"session": "s2", "reward": 0.0, "group": "g"}]))
    assert polar_process([str(tmp / "flows"), "-o", str(tmp / "out"), "-q", "--rewards", str(tmp / "r.jsonl")]) == 0
    return tmp / "out"


# -- 1. what polar-process writes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("table", [out.SEQUENCES, out.CALLS], ids=lambda t: t.name)
def test_1_1_each_table_has_the_contract_schema_the_version_and_keeps_its_rules(processed, table):
    path = table.path(processed)
    assert out.version_of(path) == out.VERSION
    frame = out.read(path)
    assert dict(frame.schema) == table.schema and frame.height
    assert table.problems(frame) == []


def test_1_2_every_batch_file_too(processed):
    files = out.batch_files(processed)
    assert files and all(out.version_of(f) == out.VERSION for f in files)
    assert all(out.BATCHES.problems(out.read(f)) == [] for f in files)


# -- 2. the rules -----------------------------------------------------------------------------------------------------

def _row(**kw):
    return {"sequence_id": "q", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "logprobs": [0.0, -1.0, -0.5],
            "n_tokens": 3, "advantage": 0.5, "reward": 1.0, "advantages": [0.0, 0.5, 0.5], **kw}


@pytest.mark.parametrize("row,broken", [
    (_row(), None),
    (_row(logprobs=None), None),  # no logprobs recorded: null, not a length
    (_row(loss_mask=[0, 1]), "len(input_ids) == len(loss_mask)"),
    (_row(logprobs=[0.0]), "len(input_ids) == len(logprobs)"),
    (_row(n_tokens=4), "n_tokens == len(input_ids)"),
    (_row(advantage=math.nan), "advantage is finite or null"),
    (_row(advantage=None, advantages=None), None),
    (_row(advantages=[0.0, 0.5]), "len(input_ids) == len(advantages)"),
    (_row(advantages=None), "advantages null exactly where advantage is"),
    (_row(reward=math.inf), "reward is finite or null"),
])
def test_2_1_a_row_that_breaks_a_rule_is_named(row, broken):
    problems = out.SEQUENCES.problems(out.SEQUENCES.frame([row]))
    assert problems == [] if broken is None else len(problems) == 1 and problems[0].startswith(
        f"sequences.parquet: 1 row(s) break the rule: {broken}")


# -- 3. versions ----------------------------------------------------------------------------------------------------

def test_3_1_a_file_from_before_the_stamp_is_read_as_version_0(tmp_path):
    path = tmp_path / "sequences.parquet"
    out.SEQUENCES.frame([_row()]).write_parquet(path)
    assert out.version_of(path) == 0 and out.read(path).height == 1


def test_3_2_a_newer_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "sequences.parquet"
    out.SEQUENCES.frame([_row()]).write_parquet(path, metadata={out.VERSION_KEY: str(out.VERSION + 1)})
    with pytest.raises(out.OutVersionError) as err:
        out.read(path)
    assert "\n" not in str(err.value) and f"OUT version {out.VERSION + 1}" in str(err.value)


def test_3_3_a_column_an_older_file_lacks_is_one_line(tmp_path):
    path = tmp_path / "calls.parquet"
    pl.DataFrame({"call_id": ["c"]}).write_parquet(path)
    with pytest.raises(out.OutVersionError, match=r"no column\(s\) temperature .*rerun polar-process"):
        out.read(path, columns=["call_id", "temperature"])


# -- 4. results.jsonl: a sample's highest attempt wins ---------------------------------------------------------------

def test_4_1_the_highest_attempt_wins_wherever_its_line_is_and_a_torn_line_is_skipped(tmp_path):
    lines = [{"task": "t", "k": 0, "attempt": 2, "status": "completed", "reward": 1.0},
             {"task": "t", "k": 0, "attempt": 1, "status": "infra_error", "reward": None},  # an older attempt, later
             {"task": "t", "k": 1, "attempt": 1, "status": "completed", "reward": 0.0},
             {"task": "t", "k": 1, "attempt": 1, "status": "completed", "reward": 0.5}]  # same attempt: the later
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"task": "t", "k": 2, "att')
    latest = results.read_latest(path)
    assert latest == {("t", 0): lines[0], ("t", 1): lines[3]}
    assert results.read_latest(tmp_path / "absent.jsonl") == {}
