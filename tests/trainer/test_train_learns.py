"""polar-train learns (issue 23): on the tiny model, with the learning rate it picks itself (no --lr), on the
generated digit-share family (examples/tasks/families: 32 training prompts, 2 drawn per step, K=4), the mean reward
of the last 3 of 12 steps is above the first 3 by at least 0.15 (0–1 reward); a control at --lr 0 over the same 12
steps does not rise. Only the reward is asserted. The python `answer` agent (one free-text turn), no sandbox, the shared float32
dev-mode server.

The run is seeded (`--seed 1`: the task draw, the shuffle, torch, and each sampler call through seed_per_call), so
on one machine it draws the same curve every time; another CPU may compute a logit in another order and draw
another curve. That is why the threshold was fixed only after measuring every seed 1–10 with this configuration
(docs/training.md, "Measured": 9 of 10 pass at the picked 16 updates per step, each curve listed), and the seed
asserted here is the first, not the best (+0.216 there). POLAR_TEST_LEARN_SEED=S runs another seed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.support.known_skips import cpu_vendor
from tests.trainer.conftest import ANSWER_AGENT, ROOT
from tests.trainer.test_train import TINY, _restore, _train

pytestmark = pytest.mark.vllm

FAMILY = ROOT / "examples" / "tasks" / "families" / "digit-share"
RISE = 0.15
SEED = int(os.environ.get("POLAR_TEST_LEARN_SEED", "1"))


def _run(dev_server, run: Path, *extra: str) -> tuple[list[float], float, str]:
    t0 = time.monotonic()
    try:
        proc = _train(str(FAMILY / "train"), "--agent", ANSWER_AGENT, "--model", str(TINY), "--out", str(run),
                      "--samples", "4", "--tasks-per-step", "2", "--seed", str(SEED), "--vllm-run-file",
                      dev_server.run_file, "--rollout-opt=--sandbox=none", "--rollout-opt=--skip-preflight", *extra,
                      timeout=2400)
    finally:
        _restore(dev_server)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
    return [ln["reward_mean"] for ln in lines], time.monotonic() - t0, proc.stderr


def _rise(rewards: list[float]) -> float:
    return sum(rewards[-3:]) / 3 - sum(rewards[:3]) / 3


@pytest.mark.skipif(cpu_vendor() != "AuthenticAMD", reason=(  # tests/known-skips.txt
    f"seed {SEED}'s bar was measured on AMD EPYC; this CPU ({cpu_vendor()}) draws another curve (issue 41 re-measures "
    "the defaults)"))
def test_the_default_learning_rate_learns(dev_server, tmp_path):
    rewards, wall, stderr = _run(dev_server, tmp_path / "run", "--steps", "12")
    plan = json.loads((tmp_path / "run" / "train.json").read_text())
    assert plan["lr"] > 0 and plan["lr_source"].startswith("picked")
    assert "picked" in stderr.splitlines()[0]
    lines = [json.loads(x) for x in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    assert all(ln["seconds"]["checkpoint"] > 0 for ln in lines if ln["published"])  # the write is counted
    if os.environ.get("POLAR_TEST_MEASURE"):
        print(f"\nlearns (seed {SEED}): {wall:.1f} s, rewards {[round(r, 3) for r in rewards]}")
    assert len(rewards) == 12 and _rise(rewards) >= RISE, rewards


def test_an_lr_0_control_does_not_rise(dev_server, tmp_path):
    rewards, wall, stderr = _run(dev_server, tmp_path / "run", "--steps", "12", "--lr", "0")
    if os.environ.get("POLAR_TEST_MEASURE"):
        print(f"\nlr-0 control (seed {SEED}): {wall:.1f} s, rewards {[round(r, 3) for r in rewards]}")
    assert stderr.count("step-0000 keeps serving") == 12, stderr  # nothing was ever published
    assert not any((tmp_path / "run" / "checkpoints").iterdir())
    assert len(rewards) == 12 and _rise(rewards) < RISE / 3, rewards
