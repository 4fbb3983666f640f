"""Scenarios for `polar-export` (trainer/export.py, docs/trainer-formats.md) on processor output built from synthetic
records.

1.x  rows written and left out, files and manifest (every format)
2.x  slime field by field
3.x  prime-rl field by field
4.x  verl field by field
5.x  the field maps against the frameworks' documented field lists (fixtures/<framework>_fields.json)
6.x  the CLI: bad input, and no torch in the base install
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from polar.processor.cli import main as process
from polar.trainer.export import FORMATS, PROVENANCE, export, main, token_temperatures
from tests.processor.synth import session_records, write_flows

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "fixtures"

# session → (ops, reward, group); s9 has no reward (its advantage is null).
SESSIONS = {
    "s0": (["turn", "trunc", "turn"], 1.0, "g"),  # truncated_turn
    "s1": (["turn", "drift", "turn", "turn"], 0.0, "g"),  # context_mismatch
    "s2": (["turn", "nolp", "turn"], 1.0, "h"),  # missing_logprobs
    "s3": (["turn", "turn", "compact", "turn"], 0.0, "h"),  # prefix_diverged: two sequences, one session
    "s4": (["turn", "turn"], 0.5, "h"),  # its second call has no recorded temperature
    "s9": (["turn"], None, None),
}
NO_TEMPERATURE = ("s4", 1)


def _records() -> list[dict]:
    recs = []
    for i, (session, (ops, _, _)) in enumerate(SESSIONS.items()):
        for k, r in enumerate(session_records(session, ops, seed=i, t0=1_700_000_000.0 + 1000 * i)):
            # A temperature per call, so a token's temperature says which call it was attributed to.
            r["sampling"] = {} if (session, k) == NO_TEMPERATURE else {"temperature": round(0.5 + 0.1 * k + i / 100, 3)}
            recs.append(r)
    return recs


@pytest.fixture(scope="module")
def processed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    write_flows(str(root / "flows"), _records(), per_file=5)
    (root / "rewards.jsonl").write_text("\n".join(json.dumps({"session": s, "reward": r, "group": g})
                                                  for s, (_, r, g) in SESSIONS.items() if r is not None))
    assert process([str(root / "flows"), "-o", str(root / "out"), "-q", "--rewards", str(root / "rewards.jsonl"),
                    "--max-batch-tokens", "90"]) == 0
    return root / "out"


@pytest.fixture(scope="module")
def sequences(processed) -> pl.DataFrame:
    """Every batch row, in file order: what the export reads."""
    files = sorted((processed / "batches").glob("*.parquet"))
    assert len(files) > 1  # the export must read several batch files in order
    return pl.concat([pl.read_parquet(f) for f in files])


@pytest.fixture(scope="module")
def temperatures(processed) -> dict:
    calls = pl.read_parquet(processed / "calls.parquet")
    return dict(zip(calls["call_id"].to_list(), calls["temperature"].to_list()))


def _export_all(processed, tmp_path_factory, keep_mismatched: bool) -> dict:
    out = {}
    for fmt in FORMATS:
        d = tmp_path_factory.mktemp(fmt) / "dir"
        manifest = export(str(processed), fmt, str(d), rows_per_file=2, keep_mismatched=keep_mismatched)
        out[fmt] = (manifest, d, pl.concat([pl.read_parquet(d / f) for f in manifest["files"]]))
    return out


@pytest.fixture(scope="module")
def exported(processed, tmp_path_factory):
    """fmt → (manifest, dir, rows in file order), with --keep-mismatched (every flagged row the formats allow)."""
    return _export_all(processed, tmp_path_factory, True)


@pytest.fixture(scope="module")
def exported_default(processed, tmp_path_factory):
    """The same without --keep-mismatched: context_mismatch sequences left out."""
    return _export_all(processed, tmp_path_factory, False)


def rows_of(exported, fmt, sequences):
    """(exported row, its sequence row) pairs."""
    by_id = {r["sequence_id"]: r for r in sequences.iter_rows(named=True)}
    return [(r, by_id[r["sequence_id"]]) for r in exported[fmt][2].iter_rows(named=True)]


# ---------------------------------------------------------------------------------------------------- 1. rows

def _expected_left_out(fmt: str, seq: dict, temperatures: dict, keep_mismatched: bool = True) -> str | None:
    if seq["advantage"] is None:
        return "null_advantage"
    if not keep_mismatched and "context_mismatch" in seq["flags"]:
        return "context_mismatch"
    if fmt != "slime" and seq["logprobs"] is None:
        return "missing_logprobs"
    if fmt == "prime-rl" and any(temperatures[c] is None for c in seq["call_ids"]):
        return "unknown_temperature"
    return None


@pytest.mark.parametrize("keep", [True, False], ids=["keep_mismatched", "default"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_1_1_one_row_per_kept_sequence_in_order_and_the_rest_counted(fmt, keep, exported, exported_default,
                                                                      sequences, temperatures):
    manifest, _, rows = (exported if keep else exported_default)[fmt]
    assert manifest["keep_mismatched"] is keep
    why = [_expected_left_out(fmt, s, temperatures, keep) for s in sequences.iter_rows(named=True)]
    kept = [sid for sid, w in zip(sequences["sequence_id"].to_list(), why) if w is None]
    assert rows["sequence_id"].to_list() == kept
    counted = {w: why.count(w) for w in set(why) if w is not None}
    assert manifest["left_out"] == counted and counted["null_advantage"] == 1  # s9
    assert manifest["rows"] == len(kept) and manifest["rows_read"] == sequences.height
    kept_seqs = sequences.filter(pl.col("sequence_id").is_in(kept))
    assert manifest["tokens"] == kept_seqs["n_tokens"].sum()
    assert manifest["trainable_tokens"] == kept_seqs["n_trainable"].sum()
    assert manifest["columns"] == list(rows.columns) == [*FORMATS[fmt].fields, *PROVENANCE]


def test_1_2_left_out_reasons_are_format_specific(exported, exported_default):
    assert set(exported["slime"][0]["left_out"]) == {"null_advantage"}
    assert set(exported["verl"][0]["left_out"]) == {"null_advantage", "missing_logprobs"}
    assert set(exported["prime-rl"][0]["left_out"]) == {"null_advantage", "missing_logprobs", "unknown_temperature"}
    # by default every format leaves out s1, the context_mismatch session (issue 37)
    for fmt in FORMATS:
        kept = set(exported[fmt][0]["left_out"])
        assert set(exported_default[fmt][0]["left_out"]) == kept | {"context_mismatch"}
        assert exported_default[fmt][0]["left_out"]["context_mismatch"] == 1
        assert exported_default[fmt][0]["rows"] == exported[fmt][0]["rows"] - 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_1_3_files_hold_rows_per_file_rows_and_the_manifest_lists_them(fmt, exported):
    manifest, d, rows = exported[fmt]
    assert sorted(os.listdir(d)) == sorted([*manifest["files"], "manifest.json"])
    assert manifest["files"] == [f"{fmt}-{i:05d}.parquet" for i in range(len(manifest["files"]))]
    heights = [pl.read_parquet(d / f).height for f in manifest["files"]]
    assert sum(heights) == rows.height and all(h == 2 for h in heights[:-1]) and 1 <= heights[-1] <= 2
    assert json.loads((d / "manifest.json").read_text()) == manifest


@pytest.mark.parametrize("fmt", FORMATS)
def test_1_4_a_run_without_rewards_exports_no_row_and_counts_them_all(fmt, tmp_path):
    recs = session_records("x", ["turn", "turn"], seed=7)
    for r in recs:
        r["sampling"] = {"temperature": 1.0}
    write_flows(str(tmp_path / "flows"), recs)
    assert process([str(tmp_path / "flows"), "-o", str(tmp_path / "out"), "-q"]) == 0
    manifest = export(str(tmp_path / "out"), fmt, str(tmp_path / "dir"))
    assert manifest["rows"] == 0 and manifest["files"] == [] and manifest["left_out"] == {"null_advantage": 1}
    assert os.listdir(tmp_path / "dir") == ["manifest.json"]


# ---------------------------------------------------------------------------------------------------- 2. slime

def test_2_1_slime_cuts_the_response_at_prompt_len(exported, sequences):
    for r, s in rows_of(exported, "slime", sequences):
        p = s["prompt_len"]
        assert r["tokens"] == s["input_ids"]
        assert r["response_length"] == s["n_tokens"] - p == len(r["loss_mask"]) == len(r["rollout_log_probs"])
        assert r["loss_mask"] == s["loss_mask"][p:]
        want = s["logprobs"][p:] if s["logprobs"] is not None else [0.0] * (s["n_tokens"] - p)
        assert r["rollout_log_probs"] == want
        assert r["reward"] == s["reward"]


def test_2_2_slime_status_and_remove_sample_follow_the_flags(exported, sequences):
    statuses, removed = set(), 0
    for r, s in rows_of(exported, "slime", sequences):
        assert r["status"] == ("truncated" if "truncated_turn" in s["flags"] else "completed")
        assert r["remove_sample"] == bool({"context_mismatch", "missing_logprobs"} & set(s["flags"]))
        statuses.add(r["status"])
        removed += r["remove_sample"]
    assert statuses == {"truncated", "completed"} and removed == 2  # s1 (mismatch) and s2 (no logprobs)


def test_2_3_slime_ids_are_dense_and_a_session_is_one_rollout(exported, sequences):
    pairs = rows_of(exported, "slime", sequences)
    first_seen = list(dict.fromkeys(s["session"] for _, s in pairs))
    groups = list(dict.fromkeys(s["group"] for _, s in pairs))
    for r, s in pairs:
        assert r["rollout_id"] == r["index"] == first_seen.index(s["session"])
        assert r["group_index"] == groups.index(s["group"])
    s3 = [r["rollout_id"] for r, s in pairs if s["session"] == "s3"]
    assert len(s3) == 2 and len(set(s3)) == 1  # a break's two sequences share their rollout


# ---------------------------------------------------------------------------------------------------- 3. prime-rl

def test_3_1_prime_rl_rows_are_the_sequence_token_for_token(exported, sequences):
    for r, s in rows_of(exported, "prime-rl", sequences):
        n = s["n_tokens"]
        assert r["token_ids"] == s["input_ids"] and r["logprobs"] == s["logprobs"]
        assert r["mask"] == [bool(m) for m in s["loss_mask"]]
        assert len(r["temperatures"]) == len(r["advantages"]) == n


def test_3_2_prime_rl_temperatures_are_each_call_s_own(exported, sequences, temperatures):
    for r, s in rows_of(exported, "prime-rl", sequences):
        spans = s["call_spans"]
        assert set(r["temperatures"][:s["prompt_len"]]) == {np.float32(temperatures[spans[0]["call_id"]])}
        for span in spans:
            want = np.float32(temperatures[span["call_id"]])
            assert set(r["temperatures"][span["start"]:span["end"]]) == {want}


def test_3_3_prime_rl_advantage_is_on_mask_1_tokens_only(exported, sequences):
    for r, s in rows_of(exported, "prime-rl", sequences):
        want = [np.float32(s["advantage"]) if m else 0.0 for m in s["loss_mask"]]
        assert r["advantages"] == want
        assert all(np.copysign(1.0, a) == 1.0 for a, m in zip(r["advantages"], s["loss_mask"]) if not m)


def test_3_4_token_temperatures_attribute_context_to_the_next_call():
    spans = [{"call_id": "a", "start": 3, "end": 5}, {"call_id": "b", "start": 8, "end": 10}]
    got = token_temperatures(10, spans, {"a": 0.5, "b": 0.9}).tolist()
    assert got == [0.5] * 5 + [np.float32(0.9)] * 5


# ---------------------------------------------------------------------------------------------------- 4. verl

def test_4_1_verl_splits_at_prompt_len_and_aligns_the_response(exported, sequences):
    for r, s in rows_of(exported, "verl", sequences):
        p, n = s["prompt_len"], s["n_tokens"]
        assert len(r["prompts"]) == p and r["prompts"] + r["responses"] == r["input_ids"] == s["input_ids"]
        assert r["response_mask"] == s["loss_mask"][p:] and r["rollout_log_probs"] == s["logprobs"][p:]
        assert r["attention_mask"] == [1] * n and r["position_ids"] == list(range(n))
        assert r["uid"] == s["group"]
        assert r["advantages"] == [np.float32(s["advantage"]) if m else 0.0 for m in r["response_mask"]]
        # The response's mask-1 tokens are the calls' completions, at their spans shifted by prompt_len.
        for span in s["call_spans"]:
            a, b = span["start"] - p, span["end"] - p
            assert r["responses"][a:b] == s["input_ids"][span["start"]:span["end"]]
            assert set(r["response_mask"][a:b]) <= {1}


# ---------------------------------------------------------------------------------------------------- 5. field maps

def _fixture(fmt: str) -> dict:
    return json.loads((FIXTURES / f"{fmt}_fields.json").read_text())


@pytest.mark.parametrize("fmt", FORMATS)
def test_5_1_every_field_written_is_one_the_framework_documents(fmt):
    doc = _fixture(fmt)
    assert doc["comment"] and doc["fields"]
    assert [f for f in FORMATS[fmt].fields if f not in doc["fields"]] == []


@pytest.mark.parametrize("fmt,group", [("slime", "response_aligned"), ("prime-rl", "token_aligned"),
                                       ("verl", "response_aligned"), ("verl", "full_length")])
def test_5_2_fields_the_framework_aligns_have_one_length_per_row(fmt, group, exported):
    names = [f for f in _fixture(fmt)[group] if f in FORMATS[fmt].fields]
    assert len(names) >= 2
    for row in exported[fmt][2].iter_rows(named=True):
        assert len({len(row[f]) for f in names}) == 1, (fmt, group, row["sequence_id"])
    if fmt == "slime":
        assert all(len(row["loss_mask"]) == row["response_length"] for row in exported[fmt][2].iter_rows(named=True))


def test_5_3_slime_status_is_a_sample_status_value(exported):
    assert set(exported["slime"][2]["status"]) <= set(_fixture("slime")["status_values"])


# ---------------------------------------------------------------------------------------------------- 6. CLI

@pytest.mark.parametrize("case", ["no_batches", "unknown_format", "dir_not_empty"])
def test_6_1_bad_input_exits_2_with_one_line_naming_the_fix(case, processed, tmp_path, capsys):
    d = tmp_path / "dir"
    out, fmt, fix = str(processed), "slime", "pass a new or empty directory"
    if case == "no_batches":
        out, fix = str(tmp_path), "pass the -o directory of a polar-process run"
    elif case == "unknown_format":
        fmt, fix = "trl", "use one of verl, slime, prime-rl"
    else:
        d.mkdir()
        (d / "keep.txt").write_text("mine")
    assert main([out, "--format", fmt, "-o", str(d)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("polar-export: ") and fix in err[0]
    assert (sorted(os.listdir(d)) == ["keep.txt"]) if case == "dir_not_empty" else not d.exists()


def test_6_2_the_cli_writes_the_export_and_says_so(processed, tmp_path, capsys):
    assert main([str(processed), "--format", "verl", "-o", str(tmp_path / "v")]) == 0
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    assert manifest["files"] == ["verl-00000.parquet"] and manifest["rows_per_file"] == 512
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"{manifest['rows']} verl rows" in last and "1 context_mismatch" in last
    assert manifest["left_out"]["context_mismatch"] == 1 and manifest["keep_mismatched"] is False
    assert main([str(processed), "--format", "verl", "-o", str(tmp_path / "k"), "--keep-mismatched"]) == 0
    kept = json.loads((tmp_path / "k" / "manifest.json").read_text())
    assert "context_mismatch" not in kept["left_out"] and kept["rows"] == manifest["rows"] + 1
    assert "context_mismatch" not in capsys.readouterr().out


def test_6_3_importing_the_export_loads_no_torch():
    """torch is installed here, so a stray import would show in sys.modules."""
    code = "import sys, polar.trainer.export; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
    assert subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


# ---------------------------------------------------------------------------------------------------- 7. credit

def _rewritten(processed: Path, root: Path, change) -> Path:
    """A copy of OUT whose batch files went through `change(frame)` (written with the OUT stamp)."""
    from polar.records import out as out_tables
    (root / "batches").mkdir(parents=True)
    shutil.copy(processed / "calls.parquet", root / "calls.parquet")
    for f in sorted((processed / "batches").glob("*.parquet")):
        change(pl.read_parquet(f)).write_parquet(root / "batches" / f.name, metadata=out_tables.metadata())
    return root


def _turn_credit(frame: pl.DataFrame) -> pl.DataFrame:
    """Each row's first call's tokens + 0.25, as --credit turn writes a term on a call's span."""
    rows = []
    for adv, spans in zip(frame["advantages"].to_list(), frame["call_spans"].to_list()):
        if adv is not None:
            adv = list(adv)
            for t in range(spans[0]["start"], spans[0]["end"]):
                adv[t] += 0.25
        rows.append(adv)
    return frame.with_columns(pl.Series("advantages", rows, dtype=pl.List(pl.Float32)))


def test_7_1_verl_and_prime_rl_write_the_per_token_column_and_slime_refuses_it(processed, tmp_path, capsys):
    out = _rewritten(processed, tmp_path / "turn", _turn_credit)
    column = {r["sequence_id"]: r for r in pl.concat([pl.read_parquet(f) for f in sorted(
        (out / "batches").glob("*.parquet"))]).iter_rows(named=True)}
    for fmt, key in (("verl", "responses"), ("prime-rl", "token_ids")):
        manifest = export(str(out), fmt, str(tmp_path / fmt))
        rows = pl.concat([pl.read_parquet(tmp_path / fmt / f) for f in manifest["files"]])
        assert rows.height
        for r in rows.iter_rows(named=True):
            seq = column[r["sequence_id"]]
            want = seq["advantages"][seq["prompt_len"]:] if fmt == "verl" else seq["advantages"]
            assert r["advantages"] == want and len(want) == len(r[key])
            assert any(a != np.float32(seq["advantage"]) for a, m in zip(seq["advantages"], seq["loss_mask"]) if m)
    assert main([str(out), "--format", "slime", "-o", str(tmp_path / "slime")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--credit turn" in err[0] and "--credit session" in err[0]
    assert not (tmp_path / "slime").exists()


def test_7_2_a_batch_without_the_column_exports_the_broadcast(processed, exported, tmp_path):
    out = _rewritten(processed, tmp_path / "v1", lambda f: f.drop("advantages"))
    for fmt in ("verl", "prime-rl", "slime"):
        manifest = export(str(out), fmt, str(tmp_path / fmt), rows_per_file=2, keep_mismatched=True)
        rows = pl.concat([pl.read_parquet(tmp_path / fmt / f) for f in manifest["files"]])
        assert rows.to_dicts() == exported[fmt][2].to_dicts()
