"""polar-train --resume after a kill at each stage (issue 23), one run carried through four processes on the shared
float32 dev-mode tiny server (the answer agent on vowel-share, K=4, 2 steps, lr 1e-3, one update a step):

1. killed (SIGKILL to its whole process group, polar-rollout included) during step 1's rollout, once a sample has
   finished;
2. --resume: the rollout continues — the finished samples are kept, not run again — and the process is killed right
   after step 1's checkpoint is written (`POLAR_TRAIN_KILL_AT=checkpoint:1`: the seam in polar.trainer.train);
3. --resume: step 1 is published from its checkpoint and its line appended — not trained again (the checkpoint's
   files are the same files) — then step 2 trains and is killed after its publication, before its line
   (`publication:2`: on disk the same as a kill during publication — a checkpoint without a line — and --resume
   publishes again whatever the server holds);
4. --resume: step 2's line is appended from its checkpoint; exit 0.

The optimizer's state goes through every stop: AdamW's step count in step 2's checkpoint is 2 (one update a step),
not 1 (a fresh optimizer)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import ANSWER_AGENT, TRAIN_TASK
from tests.trainer.test_train import POLAR_TRAIN, TINY, _restore

pytestmark = pytest.mark.vllm

STEP_TIMEOUT = 900  # a generous bound for one polar-train process on a loaded 2-core machine (not a speed claim)


def _start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*POLAR_TRAIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **(env or {})})


def _results(run: Path, step: int) -> list[dict]:
    path = run / "steps" / f"{step:04d}" / "results.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def _lines(run: Path) -> list[dict]:
    path = run / "train.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _files(ckpt: Path) -> dict[str, tuple[int, int]]:
    """Each file of a checkpoint: (inode, mtime ns) — the same file, not a rewrite of it."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in ckpt.iterdir()}


def _kill_when_a_sample_finished(proc: subprocess.Popen, run: Path) -> list[dict]:
    deadline = time.monotonic() + STEP_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        done = _results(run, 1)
        if done:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
            return done
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
    pytest.fail(f"no sample finished before the deadline or the exit ({proc.returncode}):\n{err[-4000:]}")


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=STEP_TIMEOUT)
    return proc.returncode, err


@pytest.fixture(scope="module")
def resumed(dev_server, tmp_path_factory):
    run = tmp_path_factory.mktemp("resume") / "run"
    seen: dict = {}
    args = [str(TRAIN_TASK), "--agent", ANSWER_AGENT, "--model", str(TINY), "--out", str(run), "--steps", "2",
            "--samples", "4", "--lr", "1e-3", "--vllm-run-file", dev_server.run_file,
            "--rollout-opt=--sandbox=none", "--rollout-opt=--skip-preflight", "--rollout-opt=--parallel=2"]
    resume = ["--out", str(run), "--resume"]
    try:
        seen["killed_in_rollout"] = _kill_when_a_sample_finished(_start(args), run)
        seen["after_rollout_kill"] = _lines(run)
        seen["exit_checkpoint"], seen["err_checkpoint"] = _finish(_start(resume, {"POLAR_TRAIN_KILL_AT":
                                                                                 "checkpoint:1"}))
        seen["ckpt1_files"] = _files(run / "checkpoints" / "step-0001")
        seen["after_checkpoint_kill"] = _lines(run)
        seen["exit_publication"], seen["err_publication"] = _finish(_start(resume, {"POLAR_TRAIN_KILL_AT":
                                                                                   "publication:2"}))
        seen["after_publication_kill"] = _lines(run)
        seen["ckpt2_files"] = _files(run / "checkpoints" / "step-0002")
        seen["exit"], seen["err"] = _finish(_start(resume))
    finally:
        _restore(dev_server)
    return run, seen


def test_1_a_kill_in_rollout_keeps_the_finished_samples(resumed):
    run, seen = resumed
    assert seen["after_rollout_kill"] == []
    kept = {(r["task"], r["k"], r["attempt"]) for r in seen["killed_in_rollout"]}
    final = _results(run, 1)
    assert kept <= {(r["task"], r["k"], r["attempt"]) for r in final}
    for task, k, _ in kept:  # not run again: one attempt line for each sample finished before the kill
        assert sum(1 for r in final if (r["task"], r["k"]) == (task, k)) == 1
    assert {r["k"] for r in final} == {0, 1, 2, 3}


def test_2_a_kill_after_the_checkpoint_does_not_train_the_step_again(resumed):
    run, seen = resumed
    assert seen["exit_checkpoint"] == -signal.SIGKILL, seen["err_checkpoint"][-3000:]
    assert seen["after_checkpoint_kill"] == []
    assert "trained and saved before the stop; publishing step-0001" in seen["err_publication"]
    assert _files(run / "checkpoints" / "step-0001") == seen["ckpt1_files"]  # the same files: not retrained
    assert [ln["step"] for ln in seen["after_publication_kill"]] == [1]


def test_3_a_kill_in_publication_appends_the_line_once(resumed):
    run, seen = resumed
    assert seen["exit_publication"] == -signal.SIGKILL, seen["err_publication"][-3000:]
    assert seen["exit"] == 0, seen["err"][-5000:]
    assert "publishing step-0002" in seen["err"]
    assert _files(run / "checkpoints" / "step-0002") == seen["ckpt2_files"]
    lines = _lines(run)
    assert [ln["step"] for ln in lines] == [1, 2]
    assert [ln["weight_version"] for ln in lines] == ["step-0000", "step-0001"]
    assert all(ln["published"] and ln["updates"] == 1 for ln in lines)


def test_4_the_optimizer_state_survives_every_stop(resumed):
    run, _ = resumed
    state = torch.load(run / "checkpoints" / "step-0002" / "trainer_state.pt", weights_only=True)
    steps = {float(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {2.0}, steps  # one update in each step, the moments carried over
    assert state["step"] == 2 and state["cursor"] == 3
    assert json.loads(state["line"])["step"] == 2
