"""polar-train steps without a reward spread (issue 23) on the shared float32 dev-mode tiny server:

- the python `answer` agent on a task whose verifier gives every sample the same reward: every group is counted in
  `groups_without_spread`, no update is made, nothing is checkpointed or published (the same version keeps serving,
  said in the step's line), and the loop goes on to exit 0;
- a real agent CLI (Pi, bwrap, K=2, 2 steps) on hello-file, which a random model never solves: the same — the loop
  that used to stop at its first step with 'the logprob probe did not change' goes on and exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import polars as pl
import pytest

from tests.e2e.conftest import NPM_BIN
from tests.support.need import CLIS as CLIS_SETUP
from tests.support.need import need, need_sandbox
from tests.trainer.conftest import ANSWER_AGENT, ROOT
from tests.trainer.test_train import TINY, _restore, _train

pytestmark = pytest.mark.vllm

CONSTANT_TEST_SH = """#!/usr/bin/env bash
# every sample scores the same: no group has a reward spread
mkdir -p "${POLAR_LOGS:-/logs/verifier}" && echo 0.5 > "${POLAR_LOGS:-/logs/verifier}/reward.txt"
"""


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]


def _constant_task(base: Path) -> Path:
    task = base / "same-reward"
    shutil.copytree(ROOT / "examples" / "tasks" / "vowel-share", task)
    (task / "tests" / "test.sh").write_text(CONSTANT_TEST_SH)
    return task


def test_a_step_without_spread_makes_no_update_and_the_loop_goes_on(dev_server, tmp_path):
    run = tmp_path / "run"
    try:
        t0 = time.monotonic()
        proc = _train(str(_constant_task(tmp_path)), "--agent", ANSWER_AGENT, "--model", str(TINY), "--out",
                      str(run), "--steps", "2", "--samples", "2", "--lr", "1e-2", "--vllm-run-file",
                      dev_server.run_file, "--rollout-opt=--sandbox=none", "--rollout-opt=--skip-preflight")
        wall = time.monotonic() - t0
    finally:
        _restore(dev_server)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = _lines(run)
    assert [ln["step"] for ln in lines] == [1, 2]
    for ln in lines:
        assert ln["groups"] == 1 and ln["groups_without_spread"] == 1 and ln["reward_std"] == 0
        assert ln["updates"] == 0 and ln["published"] is False and ln["weight_version"] == "step-0000"
        assert ln["response_len"] > 0 and ln["entropy"] > 0 and ln["kl_initial"] == pytest.approx(0, abs=1e-9)
    assert not any((run / "checkpoints").iterdir())
    assert proc.stderr.count("no reward spread: no update, step-0000 keeps serving") == 2, proc.stderr
    if os.environ.get("POLAR_TEST_MEASURE"):
        print(f"\nno-spread run: {wall:.1f} s")


def test_a_real_cli_loop_without_reward_goes_on(dev_server, tmp_path):
    """Pi through bwrap on hello-file, K=2, 2 steps: every sample completes with reward 0.0 (a random model writes
    no hello.txt), so every group lacks a spread; the records of both steps are served by step-0000."""
    need_sandbox("bwrap")
    pi = os.path.join(NPM_BIN, "pi")
    need(None if os.access(pi, os.X_OK) else f"{pi} is missing", setup=CLIS_SETUP)
    run = tmp_path / "run"
    try:
        t0 = time.monotonic()
        proc = _train(str(ROOT / "examples" / "tasks" / "hello-file"), "--agent", "pi", "--model", str(TINY), "--out",
                      str(run), "--steps", "2", "--samples", "2", "--vllm-run-file", dev_server.run_file,
                      "--rollout-opt=--sandbox=bwrap", "--rollout-opt=--skip-preflight",
                      "--rollout-opt=--agent-timeout=240", timeout=1200)
        wall = time.monotonic() - t0
    finally:
        _restore(dev_server)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = _lines(run)
    assert [ln["step"] for ln in lines] == [1, 2]
    for ln in lines:
        assert ln["samples"] == 2
        assert ln["groups_without_spread"] == ln["groups"], ln  # no sample of a random model solves hello-file
        assert ln["updates"] == 0 and ln["published"] is False
    for s in (1, 2):
        versions = set(pl.read_parquet(run / "steps" / f"{s:04d}" / "out" / "calls.parquet")["weight_version"]
                       .drop_nulls().to_list())
        assert versions == {"step-0000"}
    assert "keeps serving" in proc.stderr and "reload failed" not in proc.stderr
    if os.environ.get("POLAR_TEST_MEASURE"):
        print(f"\nreal-CLI run: {wall:.1f} s")
