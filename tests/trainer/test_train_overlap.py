"""polar-train --max-staleness 1 (issue 23) on the shared float32 dev-mode tiny server: step n+1's rollout is asked
for as soon as step n's is in and runs while step n verifies, trains and publishes (the answer agent on vowel-share,
K=4, 3 steps, lr 1e-3).

- every record names the version that sampled it, through the serve's proxy, which each publication holds and
  releases with the new version: step n's calls are of step-(n−2) or step-(n−1) (and only step-0000 for step 1);
- a step's `staleness` is the trained policy's version minus the oldest version among a sample's calls, over its
  samples, as recomputed here from calls.parquet; none is past 1, so none is left out;
- in-process verify checks only the tokens of the version in memory (the others are counted as skipped);
- the overlapped steps trained (updates, a checkpoint each) and the run exits 0."""

from __future__ import annotations

import json

import polars as pl
import pytest

from tests.trainer.conftest import ANSWER_AGENT, TRAIN_TASK
from tests.trainer.test_train import TINY, _restore, _train

pytestmark = pytest.mark.vllm
OUTPUT: dict = {}  # the run's stdout (test_5)


@pytest.fixture(scope="module")
def overlapped(dev_server, tmp_path_factory):
    run = tmp_path_factory.mktemp("overlap") / "run"
    try:
        proc = _train(str(TRAIN_TASK), "--agent", ANSWER_AGENT, "--model", str(TINY), "--out", str(run), "--steps", "3",
                      "--samples", "4", "--lr", "1e-3", "--max-staleness", "1", "--vllm-run-file", dev_server.run_file,
                      "--rollout-opt=--sandbox=none", "--rollout-opt=--skip-preflight")
    finally:
        _restore(dev_server)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    OUTPUT["stdout"] = proc.stdout
    return run, [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()], proc.stderr


def _index(version: str) -> int:
    return int(version.split("-")[1])


def test_1_records_name_the_version_that_sampled_them(overlapped):
    run, lines, _ = overlapped
    assert [ln["step"] for ln in lines] == [1, 2, 3]
    for ln in lines:
        calls = pl.read_parquet(run / "steps" / f"{ln['step']:04d}" / "out" / "calls.parquet")
        versions = set(calls["weight_version"].to_list())
        allowed = {f"step-{max(ln['step'] - 2, 0):04d}", f"step-{ln['step'] - 1:04d}"}
        assert versions <= allowed, (ln["step"], versions)
    assert lines[0]["staleness"] == {"min": 0, "mean": 0, "max": 0}


def test_2_staleness_is_the_policy_version_minus_the_oldest_call(overlapped):
    run, lines, _ = overlapped
    for ln in lines:
        out = run / "steps" / f"{ln['step']:04d}" / "out"
        version_of = dict(pl.read_parquet(out / "calls.parquet").select("call_id", "weight_version").iter_rows())
        current = _index(ln["weight_version"])
        seqs = pl.read_parquet(out / "sequences.parquet").filter(pl.col("advantage").is_not_null())
        stale = [current - min(_index(version_of[c]) for c in ids) for ids in seqs["call_ids"].to_list()]
        assert ln["staleness"] == {"min": min(stale), "mean": pytest.approx(sum(stale) / len(stale)),
                                   "max": max(stale)}, ln["step"]
        assert ln["left_out_stale"] == 0 and max(stale) <= 1
        assert set(ln["clip_share_by_staleness"]) <= {str(s) for s in stale}


def test_3_verify_checks_only_the_version_in_memory(overlapped):
    run, lines, _ = overlapped
    for ln in lines:
        report = json.loads((run / "steps" / f"{ln['step']:04d}" / "out" / "report.json").read_text())["verify"]
        assert set(report["models"]) == {ln["weight_version"]}
        fresh = ln["staleness"]["min"] == 0
        assert (report["tokens"]["checked"] > 0) == fresh
        if ln["staleness"]["max"]:
            assert report["tokens"]["skipped_no_model"] > 0


def test_4_every_step_trained_and_published(overlapped):
    run, lines, stderr = overlapped
    assert all(ln["published"] and ln["updates"] == 1 for ln in lines)
    assert [ln["weight_version"] for ln in lines] == ["step-0000", "step-0001", "step-0002"]
    assert all((run / "checkpoints" / f"step-{s:04d}" / "config.json").is_file() for s in (1, 2, 3))
    assert "rollouts up to 1 version(s) ahead" in stderr.splitlines()[0]


def test_5_every_line_is_on_stderr_as_it_happens(overlapped):
    """polar-train says what it does from its first line (the picked settings, then the rollout stage's start,
    before any step) and writes nothing to stdout: its verify summaries, step lines and vLLM lines share stderr."""
    _, _, stderr = overlapped
    assert OUTPUT["stdout"] == ""
    lines = stderr.splitlines()
    assert lines[0].startswith("polar-train: lr ") and lines[1].startswith("polar-train: starting the rollout stage")
    assert sum(1 for ln in lines if ln.startswith("polar-verify: ")) == 3


def test_6_the_rollouts_overlapped_training(overlapped):
    """Overlap at all: step n+1's rollout was asked of the serve (its request file, RUN/rollout/requests/) before step
    n's weights were even saved (checkpoints/step-n/config.json, written after verify and the update, before the
    publication). A run whose steps went one after another asks for step n+1 only after step n published, and fails
    here. Whether a call of step n+1 then reaches the proxy before step n's publication holds it (staleness 1, which
    test_2 checks when it happens) is a race of this machine's speeds: a fast trainer publishes first."""
    run, lines, _ = overlapped
    for prev, ln in zip(lines, lines[1:]):
        asked = (run / "rollout" / "requests" / f"step-{ln['step']:04d}.json").stat().st_mtime
        saved = (run / "checkpoints" / f"step-{prev['step']:04d}" / "config.json").stat().st_mtime
        assert prev["published"] and asked < saved, (ln["step"], asked, saved)
