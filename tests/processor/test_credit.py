"""Scenarios for processor/credit.py: rule 11 (`--credit session|turn`, `--turn-gamma`) and the per-token
`advantages` column.

1.x  the turn terms against a hand-computed table; fallbacks
2.x  per-token advantages of one sequence
3.x  end to end through polar-process: the column under --credit turn, and --credit session = the scalar broadcast
"""

from __future__ import annotations

import math

import numpy as np
import orjson
import polars as pl
import pytest

from polar.processor import credit
from polar.processor import rewards as rw
from polar.processor.cli import main
from polar.records import out as out_tables
from tests.processor.calls import EOT, record
from tests.processor.synth import write_flows

pytestmark = pytest.mark.unit


def scores(calls, values, final):
    return credit.TurnScores(tuple(calls), tuple(values), final)


# Group g: A moves 0 → 0 → 0.5 → 1 over three calls, B 0 → 0.5 and stops there, C makes no progress in one call.
# γ = 0.5: G(A) = (3/8, 3/4, 1/2), G(B) = (1/2, 0), G(C) = (0,); the sessions that stopped count 0 at later indices.
# mean norm: index 1 mean 7/24 → A 1/12, B 5/24, C −7/24; index 2 (3/4, 0, 0) mean 1/4 → A 1/2, B −1/4;
# index 3 (1/2, 0, 0) mean 1/6 → A 1/3.
# std norm: index 1 σ = √(13/288) → A √(2/13), B 5/√26, C −7/√26; index 2 σ = √(1/8) → A √2, B −1/√2;
# index 3 σ = √(1/18) → A √2.
GROUP = {
    "A": scores(["a1", "a2", "a3"], [0.0, 0.0, 0.5], 1.0),
    "B": scores(["b1", "b2"], [0.0, 0.5], 0.5),
    "C": scores(["c1"], [0.0], 0.0),
}
MEAN_TABLE = {"A": {"a1": 1 / 12, "a2": 1 / 2, "a3": 1 / 3}, "B": {"b1": 5 / 24, "b2": -1 / 4}, "C": {"c1": -7 / 24}}
STD_TABLE = {"A": {"a1": math.sqrt(2 / 13), "a2": math.sqrt(2), "a3": math.sqrt(2)},
             "B": {"b1": 5 / math.sqrt(26), "b2": -1 / math.sqrt(2)}, "C": {"c1": -7 / math.sqrt(26)}}


@pytest.mark.parametrize("norm,table", [("mean", MEAN_TABLE), ("std", STD_TABLE)])
def test_1_1_turn_terms_equal_the_hand_computed_table(norm, table):
    got = credit.turn_terms(GROUP, {s: "g" for s in GROUP}, 0.5, norm)
    assert got.fallback == 0
    assert got.terms.keys() == table.keys()
    for s, want in table.items():
        assert got.terms[s] == pytest.approx(want, abs=1e-12), s


def test_1_2_gamma_smears_progress_back():
    a = GROUP["A"]
    assert credit.returns(a, 0.0) == [0.0, 0.5, 0.5]  # each call its own progress
    assert credit.returns(a, 1.0) == [1.0, 1.0, 0.5]  # to the session's end: final − s_k
    assert credit.returns(a, 0.5) == [0.375, 0.75, 0.5]


def test_1_3_a_session_s_baseline_does_not_depend_on_when_it_stopped():
    # Two groups alike but for C: in one it stops after its first call, in the other it takes two more calls that
    # change nothing. Its state, and so every other session's terms, are the same (verl #7244's bias would move
    # them: a per-index mean over the sessions still running sees C only while it runs).
    short = credit.turn_terms(GROUP, {s: "g" for s in GROUP}, 0.5, "mean").terms
    longer = dict(GROUP, C=scores(["c1", "c2", "c3"], [0.0, 0.0, 0.0], 0.0))
    long_ = credit.turn_terms(longer, {s: "g" for s in longer}, 0.5, "mean").terms
    assert long_["A"] == pytest.approx(short["A"]) and long_["B"] == pytest.approx(short["B"])
    assert long_["C"]["c1"] == pytest.approx(short["C"]["c1"])


def test_1_4_unscored_sessions_and_thin_groups_fall_back_and_are_counted():
    scored = dict(GROUP, D=None, E=scores(["e1"], [0.0], 1.0), F=None, N=scores(["n1"], [0.0], 1.0))
    groups = {"A": "g", "B": "g", "C": "g", "D": "g", "E": "h", "F": "h", "N": None}
    got = credit.turn_terms(scored, groups, 0.5, "mean")
    # D: null turn_scores; E: the only scored session of h; F: null. N has no group: no advantage at all.
    assert got.fallback == 3
    assert set(got.terms) == {"A", "B", "C"}
    assert got.terms["A"] == pytest.approx(MEAN_TABLE["A"])  # D stays out of g's baselines


@pytest.mark.parametrize("value,says", [
    ({"calls": [{"call_id": "x", "score": 1.5}], "final": 1}, "in \\[0, 1\\]"),
    ({"calls": [{"call_id": "x", "score": True}], "final": 1}, "in \\[0, 1\\]"),
    ({"calls": [{"score": 0.5}], "final": 1}, "call_id"),
    ({"calls": [{"call_id": "x", "score": 0}, {"call_id": "x", "score": 0}], "final": 0}, "twice"),
    ({"calls": []}, "must be null or"),
    ([0.1, 0.2], "must be null or"),
])
def test_1_5_bad_turn_scores_are_one_line_errors_naming_the_line(tmp_path, value, says):
    path = tmp_path / "r.jsonl"
    path.write_bytes(orjson.dumps({"session": "a", "reward": 1, "group": "g", "turn_scores": value}) + b"\n")
    with pytest.raises(rw.RewardsError, match=says) as err:
        rw.read_rewards(str(path), {"a"})
    assert str(err.value).startswith(f"{path}:1: ") and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------------- 2. a sequence

def test_2_1_each_call_span_carries_the_scalar_plus_its_term_and_untrained_tokens_zero():
    mask = np.array([0, 0, 1, 1, 0, 1, 1, 1], dtype=np.uint8)
    spans = [("a1", 2, 4), ("a2", 5, 8)]
    got = credit.token_advantages(-0.5, mask, spans, {"a1": 0.25, "a2": -1.0})
    assert got.dtype == np.float32
    assert got.tolist() == [0.0, 0.0, -0.25, -0.25, 0.0, -1.5, -1.5, -1.5]
    assert not np.signbit(got[mask == 0]).any()  # a plain 0.0, never −0.0
    session = credit.token_advantages(-0.5, mask, spans)
    assert session.tolist() == [0.0, 0.0, -0.5, -0.5, 0.0, -0.5, -0.5, -0.5]
    assert credit.token_advantages(None, mask, spans) is None


# ---------------------------------------------------------------------------------------------------- 3. end to end

P1 = [1, 9, 9, 5]


def _session(session: str, n: int, t0: float) -> list[dict]:
    """n calls of one conversation, each extending the last (one merged sequence); call ids s-1 … s-n."""
    recs, prompt = [], list(P1)
    for k in range(1, n + 1):
        completion = [20 + k, 30 + k, EOT]
        recs.append(record(prompt, completion, session=session, t=t0 + k, cid=f"{session}-{k}"))
        prompt = prompt + completion + [6, 40 + k, EOT, 5]
    return recs


def _run(tmp_path, name, lines, *extra):
    flows = tmp_path / "flows"
    if not flows.exists():
        flows.mkdir()
        recs = _session("A", 3, 1e9) + _session("B", 2, 1e9 + 100) + _session("C", 1, 1e9 + 200)
        write_flows(str(flows), recs)
    rewards = tmp_path / f"{name}.jsonl"
    rewards.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    out = tmp_path / name
    assert main([str(flows), "-o", str(out), "--rewards", str(rewards), "-q", *extra]) == 0
    return pl.read_parquet(out / "sequences.parquet").sort("session"), out


def _lines(with_scores=True):
    rewards = {"A": 1.0, "B": 0.5, "C": 0.0}
    out = []
    for s, r in rewards.items():
        ts = GROUP[s]
        turn = {"calls": [{"call_id": f"{s}-{k + 1}", "score": v} for k, v in enumerate(ts.scores)],
                "final": ts.final}
        out.append({"session": s, "reward": r, "group": "g", "turn_scores": turn if with_scores else None})
    return out


def test_3_1_credit_turn_writes_each_call_s_term_on_its_tokens(tmp_path):
    seqs, out = _run(tmp_path, "turn", _lines(), "--credit", "turn", "--turn-gamma", "0.5", "--advantage-norm",
                     "mean")
    assert seqs.height == 3 and out_tables.version_of(out / "sequences.parquet") == out_tables.VERSION
    for row in seqs.iter_rows(named=True):
        s = row["session"]
        adv = np.array(row["advantages"], dtype=np.float32)
        mask = np.array(row["loss_mask"], dtype=bool)
        assert len(adv) == row["n_tokens"] and not adv[~mask].any()
        for span in row["call_spans"]:
            want = np.float32(row["advantage"] + MEAN_TABLE[s][span["call_id"].replace("-", "").lower()])
            assert (adv[span["start"]:span["end"]] == want).all(), span
    report = orjson.loads((out / "report.json").read_bytes())
    assert (report["rewards"]["turn_credit"], report["rewards"]["turn_fallback"]) == (3, 0)
    batch = pl.read_parquet(out_tables.batch_files(out)[0]).sort("session")
    assert batch["advantages"].to_list() == seqs["advantages"].to_list()


def test_3_2_credit_session_is_the_scalar_broadcast_bit_for_bit_and_ignores_turn_scores(tmp_path):
    seqs, out = _run(tmp_path, "session", _lines())
    plain, _ = _run(tmp_path, "plain", _lines(with_scores=False))
    for row in seqs.iter_rows(named=True):
        mask = np.array(row["loss_mask"], dtype=np.uint8)
        # today's broadcast: the loader's float32 tensor took the Python float at each trained token
        today = np.where(mask == 1, np.float32(row["advantage"]), np.float32(0.0)).astype(np.float32)
        assert np.array(row["advantages"], dtype=np.float32).tobytes() == today.tobytes()
    assert seqs["advantages"].to_list() == plain["advantages"].to_list()
    assert "turn_credit" not in orjson.loads((out / "report.json").read_bytes())["rewards"]


def test_3_3_a_session_without_turn_scores_keeps_session_credit_counted(tmp_path):
    lines = _lines()
    lines[1]["turn_scores"] = None  # B's scorer failed
    seqs, out = _run(tmp_path, "fallback", lines, "--credit", "turn", "--advantage-norm", "mean")
    b = seqs.filter(pl.col("session") == "B").row(0, named=True)
    mask = np.array(b["loss_mask"], dtype=bool)
    assert (np.array(b["advantages"])[mask] == np.float32(b["advantage"])).all()
    report = orjson.loads((out / "report.json").read_bytes())
    assert (report["rewards"]["turn_credit"], report["rewards"]["turn_fallback"]) == (2, 1)


def test_3_4_turn_gamma_outside_0_1_is_a_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path), "-o", str(tmp_path / "o"), "--credit", "turn", "--turn-gamma", "1.5"])
    assert exc.value.code == 2 and "--turn-gamma" in capsys.readouterr().err
