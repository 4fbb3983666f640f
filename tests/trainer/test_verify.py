"""polar-verify (docs/architecture.md#the-trainer-side) on real rollouts of the tiny model served in float32.

Scenarios:
1.1 exact mode, T=1: median |gap| < 1e-4 and ≥ 99.9 % of the checked tokens within 0.01 nats, exit 0; the outputs
    (verify.parquet's columns and hash, report.json's `verify`, report.html's one section, dropped once stale).
1.2 a copy whose logprobs are shifted by one token fails: exit 1.
1.3 calls not sampled at T=1 are counted, not compared.
1.4 weight versions: a VERSION=DIR checks that version; a version without a DIR is skipped (nothing left: exit 2).
1.5 bad input: exit 2 with one line; without torch: the one line that names the trainer environment.
2.1 normal mode: the context_mismatch sequences are the outliers.
3.1 the outputs without a model: report.json's `verify` and report.html's one section through the processor's public
    hook, replaced (not added again) by a second run; a page without the hook's slot gets a note, not a crash.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from polar.processor.trainer_files import trainer_sections
from polar.trainer import verify

from tests.trainer.conftest import exact_rollout_args, rollout

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / ".cache" / "models" / "tiny")
DESIGN_COLUMNS = ["sequence_id", "weight_version", "n_checked", "n_constrained", "n_skipped", "median_abs_gap",
                  "max_abs_gap", "share_within", "kl_k3", "verify_flags"]


def _copy(exact_rollout: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(exact_rollout / "out", out)  # verify writes into OUT: the shared fixture stays untouched
    return out


def _verify(*argv: str) -> int:
    try:
        return verify.main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        return exc.code


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())["verify"]


def test_1_1_exact_rollout_agrees_and_the_outputs_are_written(exact_rollout, tmp_path):
    out = _copy(exact_rollout, tmp_path)
    assert _verify(str(out), "--model", TINY) == 0
    v = _report(out)
    assert v["tokens"]["checked"] > 0 and v["judged_on"] == "unflagged"
    assert v["median_abs_gap"] < 1e-4 and v["share_within"] >= 0.999
    assert v["unflagged"]["max_abs_gap"] < 1e-3
    assert v["shift_control_median"] > 10 * max(v["median_abs_gap"], 1e-4)  # the off-by-one control is far worse
    frame = pl.read_parquet(out / "verify.parquet")
    assert frame.columns == DESIGN_COLUMNS + ["sequences_sha256"]
    digest = hashlib.sha256((out / "sequences.parquet").read_bytes()).hexdigest()
    assert set(frame["sequences_sha256"]) == {digest} == {v["sequences_sha256"]}
    assert set(frame["sequence_id"]) == set(pl.read_parquet(out / "sequences.parquet")["sequence_id"])
    assert frame["n_checked"].sum() == v["tokens"]["checked"]
    assert frame["n_constrained"].sum() == v["tokens"]["constrained"]  # forced tool calls: counted apart
    assert _verify(str(out), "--model", TINY) == 0  # a second run replaces the section
    page = (out / "report.html").read_text()
    assert page.count('<div id="polar-verify">') == 1 and "Verify: recomputed vs recorded logprobs" in page
    assert trainer_sections(str(out / "verify.parquet"), None, digest) != ""
    assert trainer_sections(str(out / "verify.parquet"), None, "0" * 64) == ""  # stale: dropped


def test_1_2_logprobs_shifted_by_one_token_fail(exact_rollout, tmp_path):
    out = _copy(exact_rollout, tmp_path)
    seqs = pl.read_parquet(out / "sequences.parquet")
    seqs.with_columns(pl.col("logprobs").list.eval(pl.element().shift(1, fill_value=0.0))).write_parquet(
        out / "sequences.parquet")
    assert _verify(str(out), "--model", TINY) == 1
    assert _report(out)["median_abs_gap"] > 0.1 and not _report(out)["within_bounds"]


def test_1_3_calls_not_sampled_at_t1_are_counted_not_compared(exact_rollout, tmp_path):
    out = _copy(exact_rollout, tmp_path)
    assert _verify(str(out), "--model", TINY) == 0
    before = pl.read_parquet(out / "verify.parquet")
    hot = before.filter(pl.col("n_checked") > 0)["sequence_id"][0]
    seq = pl.read_parquet(out / "sequences.parquet").filter(pl.col("sequence_id") == hot)
    calls = pl.read_parquet(out / "calls.parquet")
    calls.with_columns(pl.when(pl.col("call_id").is_in(seq["call_ids"][0].to_list())).then(0.6).otherwise(1.0)
                       .alias("temperature")).write_parquet(out / "calls.parquet")
    assert _verify(str(out), "--model", TINY) == 0
    after = pl.read_parquet(out / "verify.parquet")
    row, was = after.filter(pl.col("sequence_id") == hot), before.filter(pl.col("sequence_id") == hot)
    assert row["n_checked"][0] == 0 and row["n_skipped"][0] == was["n_checked"][0]
    assert "sampling_not_pinned" in row["verify_flags"][0]
    assert _report(out)["tokens"]["skipped_sampling"] == was["n_checked"][0]
    assert after["n_checked"].sum() == before["n_checked"].sum() - was["n_checked"][0]


def test_1_4_weight_versions_pick_their_checkpoint(exact_rollout, tmp_path, capsys):
    out = _copy(exact_rollout, tmp_path)
    pl.read_parquet(out / "calls.parquet").with_columns(pl.lit("v1").alias("weight_version")).write_parquet(
        out / "calls.parquet")
    assert _verify(str(out), "--model", f"v1={TINY}") == 0
    v = _report(out)
    assert set(v["per_version"]) == {"v1"} and v["per_version"]["v1"]["tokens"] == v["tokens"]["checked"] > 0
    assert set(pl.read_parquet(out / "verify.parquet")["weight_version"]) == {"v1"}
    capsys.readouterr()
    assert _verify(str(out), "--model", f"v2={TINY}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "v1" in err[0] and "--model VERSION=DIR" in err[0]


@pytest.mark.parametrize("argv,says", [
    (["{missing}", "--model", TINY], "no sequences.parquet"),
    (["{out}", "--model", "/nonexistent/model"], "not a directory"),
    (["{out}", "--model", TINY, "--model", TINY], "given twice"),
    (["{out}", "--model", TINY, "--tolerance", "0"], "--tolerance"),
    (["{out}"], "--model"),
    (["{out}", "--model", TINY, "--dtype", "float16"], "--dtype"),
])
def test_1_5_bad_input_exits_2_with_one_line(exact_rollout, tmp_path, capsys, argv, says):
    out = _copy(exact_rollout, tmp_path)
    argv = [a.format(out=out, missing=tmp_path / "nothing") for a in argv]
    assert _verify(*argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not (out / "verify.parquet").exists()


def test_1_5_without_torch_one_line_names_the_trainer_environment(tmp_path):
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "polar-verify"), str(tmp_path), "--model", TINY],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert (proc.stdout + proc.stderr).strip() == verify.NEEDS_TRAIN


@pytest.fixture(scope="module")
def normal_out(dev_server, tmp_path_factory) -> Path:
    """A normal-mode (not exact) run against the same server, processed with the tokenizer's end-of-turn ids."""
    run = tmp_path_factory.mktemp("normal") / "run"
    rollout(*exact_rollout_args(dev_server.base_url, run, run_id="train-normal", exact=False))
    assert list((run / "flows").glob("*.msgpack")), "the normal-mode rollout wrote no flows"
    out = run / "verified"
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "polar-process"), str(run / "flows"), "-o", str(out),
                           "--tokenizer", TINY, "-q"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_2_1_normal_mode_context_mismatch_sequences_are_the_outliers(normal_out):
    assert _verify(str(normal_out), "--model", TINY) in (0, 1)
    frame = pl.read_parquet(normal_out / "verify.parquet").filter(pl.col("n_checked") > 0)
    flagged = frame.filter(pl.col("verify_flags").list.contains("context_mismatch"))
    clean = frame.filter(~pl.col("verify_flags").list.contains("context_mismatch"))
    assert len(flagged) > 0, "no context_mismatch in this normal-mode run"
    assert (clean["max_abs_gap"] < 1e-3).all()  # every outlier is a flagged sequence
    assert flagged["median_abs_gap"].max() > 1e-3
    assert _report(normal_out)["flagged"]["share_within"] < 0.9


def test_3_1_outputs_go_through_the_processor_s_public_hook(tmp_path):
    from polar.processor.cli import main as process
    from polar.processor.report_doc import read_report

    from tests.processor.synth import session_records, write_flows

    write_flows(str(tmp_path / "flows"), session_records("s1", ["turn", "turn", "side"], seed=1), per_file=5)
    out = tmp_path / "out"
    assert process([str(tmp_path / "flows"), "-o", str(out), "-q"]) == 0
    before = json.loads((out / "report.json").read_text())
    row = {"sequence_id": "a", "weight_version": None, "n_checked": 9, "n_constrained": 0, "n_skipped": 0,
           "median_abs_gap": 0.002, "max_abs_gap": 0.01, "share_within": 1.0, "kl_k3": 0.0, "verify_flags": [],
           "sequences_sha256": "0" * 64}
    frame = pl.DataFrame([row], schema=verify.VERIFY_SCHEMA, orient="row")
    assert verify.write_outputs(str(out), frame, {"median_abs_gap": 0.002}) == []
    assert read_report(out / "report.json").verify == {"median_abs_gap": 0.002}
    assert {**before, "verify": {"median_abs_gap": 0.002}} == json.loads((out / "report.json").read_text())
    page = (out / "report.html").read_text()
    assert page.count('<div id="polar-verify">') == 1 and "1 sequences, 9 tokens checked" in page
    assert verify.write_outputs(str(out), frame.with_columns(n_checked=pl.lit(4)), {"median_abs_gap": 0.1}) == []
    page = (out / "report.html").read_text()
    assert page.count('<div id="polar-verify">') == 1 and "4 tokens checked" in page and "9 tokens" not in page
    (out / "report.html").write_text(page.replace('<div id="polar-sections">', "<div>").replace(
        '<div id="polar-verify">', "<div>"))  # a page from before the hook
    notes = verify.write_outputs(str(out), frame, {"median_abs_gap": 0.002})
    assert len(notes) == 1 and "no sections slot" in notes[0]
