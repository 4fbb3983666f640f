"""polar-train (docs/architecture.md#the-trainer-side): the closed loop on the shared float32 dev-mode tiny server — 2
steps of rollout (the SDK answer agent on vowel-share: one free-text turn per sample, whose vowel share varies within a
group under the random model) → verify → GRPO step → checkpoint
→ reload, every stage exercised; the checkpoints' parameters differ from the start by more than weight decay alone
would make them; the second step's rollouts are served (and recorded) by the first step's weights. Bad input exits 2
with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from tests.support.need import need
from tests.trainer.conftest import ANSWER_AGENT, ROOT, SDK_AGENT, TRAIN_TASK

pytestmark = pytest.mark.vllm

TINY = ROOT / ".cache" / "models" / "tiny"
LR, WD = 1e-3, 0.01
POLAR_TRAIN = [sys.executable, "-m", "polar.trainer.train"]


def _train(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([*POLAR_TRAIN, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _restore(server) -> None:
    """The shared server goes back to the original weights (other tests run against them)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm"), "reload", "--weights", str(TINY),
                           "--version", "base", "--run-file", server.run_file], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def trained(dev_server, tmp_path_factory):
    run = tmp_path_factory.mktemp("train") / "run"
    try:
        proc = _train(str(TRAIN_TASK), "--agent", ANSWER_AGENT, "--model", str(TINY), "--out", str(run), "--steps", "2",
                      "--samples", "4", "--lr", str(LR), "--weight-decay", str(WD), "--dtype", "float32",
                      "--vllm-run-file", dev_server.run_file, "--rollout-opt=--sandbox=none",
                      "--rollout-opt=--skip-preflight")
    finally:
        _restore(dev_server)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return run, proc


def test_1_every_step_ran_every_stage(trained):
    run, proc = trained
    lines = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
    assert [ln["step"] for ln in lines] == [1, 2]
    for ln in lines:
        assert ln["samples"] == 4 and sum(ln["statuses"].values()) == 4
        assert ln["reward_mean"] is not None and ln["tokens_trainable"] > 0
        assert ln["tokens_forward"] >= ln["tokens_trainable"]
        assert set(ln["seconds"]) == {"rollout", "process", "verify", "train", "reload"}
        assert all(v >= 0 for v in ln["seconds"].values())
        assert ln["verify_share_within"] is not None and ln["ratio_mean"] is not None
        assert (run / "steps" / f"{ln['step']:04d}" / "out" / "verify.parquet").is_file()
        assert (run / "checkpoints" / f"step-{ln['step']:04d}" / "config.json").is_file()
    # float32, exact mode, T=1: the sampler's logprobs are the policy's (first step: the untouched model)
    assert lines[0]["verify_share_within"] >= 0.99 and abs(lines[0]["ratio_mean"] - 1) < 1e-3
    html = (run / "report.html").read_text()
    assert "<svg" in html and "mean reward per step" in html and "step-0001" in html
    assert "step 2" in proc.stderr


def test_2_the_reward_varies_within_a_group(trained):
    run, _ = trained
    spreads = []
    for step in (1, 2):
        seqs = pl.read_parquet(run / "steps" / f"{step:04d}" / "out" / "sequences.parquet")
        spreads.append(seqs.filter(pl.col("advantage").is_not_null())["advantage"].abs().max())
    assert max(spreads) > 0, "no group had a reward spread: GRPO had nothing to learn from"


def test_3_parameters_moved_beyond_weight_decay(trained):
    run, _ = trained
    start = load_file(str(TINY / "model.safetensors"))
    after = load_file(str(run / "checkpoints" / "step-0002" / "model.safetensors"))
    decay_only = (1 - LR * WD) ** 2  # AdamW's decoupled decay over two steps, with no gradient
    moved = 0.0
    for name, p0 in start.items():
        p0 = p0.float()
        moved = max(moved, float((after[name].float() - p0 * decay_only).abs().max()))
    assert moved > 10 * LR * WD * max(float(t.float().abs().max()) for t in start.values()), moved


def test_4_step_two_was_served_by_step_one_weights(trained):
    run, _ = trained
    versions = [set(pl.read_parquet(run / "steps" / f"{s:04d}" / "out" / "calls.parquet")["weight_version"]
                    .drop_nulls().to_list()) for s in (1, 2)]
    assert versions == [{"step-0000"}, {"step-0001"}]
    lines = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
    assert [ln["weight_version"] for ln in lines] == ["step-0000", "step-0001"]


@pytest.mark.parametrize("args,needle", [
    (["--out", "X"], "TASKS, --agent and --model are required"),
    (["--out", "X", "--resume"], "holds no polar-train run"),
    ([str(TRAIN_TASK), "--agent", SDK_AGENT, "--model", "/nonexistent", "--out", "X"], "not an HF checkpoint"),
    ([str(TRAIN_TASK), "--agent", SDK_AGENT, "--model", str(TINY), "--out", "X", "--samples", "1"], "≥ 2 samples"),
    ([str(TRAIN_TASK), "--agent", SDK_AGENT, "--model", str(TINY), "--out", "X", "--steps", "0"], "--steps 0"),
])
def test_5_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    args = [str(tmp_path / a) if a == "X" else a for a in args]
    proc = _train(*args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_6_a_non_empty_out_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("")
    proc = _train(str(TRAIN_TASK), "--agent", SDK_AGENT, "--model", str(TINY), "--out", str(tmp_path / "run"),
                  timeout=120)
    assert proc.returncode == 2 and "not empty" in proc.stderr


def test_7_torch_is_needed_and_said_so():
    """The console script under the proxy's .venv (no torch) says which environment to use, in one line."""
    exe = Path(ROOT) / ".venv" / "bin" / "polar-train"
    need(None if exe.exists() else f"{exe} is missing", setup="scripts/setup")
    proc = subprocess.run([str(exe), str(TRAIN_TASK), "--agent", SDK_AGENT, "--model", str(TINY), "--out",
                           "/tmp/polar-train-never"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "polar-train needs the trainer environment: scripts/setup --train, then .venv-train/bin/polar-train")
    assert torch.__version__  # this session's own environment has it
