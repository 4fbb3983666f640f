"""polar-train (docs/architecture.md#the-trainer-side): the closed loop on the shared float32 dev-mode tiny server — 2
steps of rollout (the SDK answer agent on vowel-share: one free-text turn per sample, whose vowel share varies within a
group under the random model) → verify → GRPO step → checkpoint
→ reload, every stage exercised; the checkpoints' parameters differ from the start by more than weight decay alone
would make them; the second step's rollouts are served (and recorded) by the first step's weights. Bad input exits 2
with one line.

The run is carried through four processes, killed at each point --resume must survive (issue 23; tests 8–11):
1. killed (SIGKILL to its process group) during step 1's rollout, once a sample has finished;
1b. --resume, sent SIGTERM once it has asked for step 1's rollout again: it ends its serve (and the serve's proxy)
   before it exits 143, and says how to go on;
2. --resume: the rollout continues — finished samples kept, not run again — and it is killed right after step 1's
   checkpoint is written (`POLAR_TRAIN_KILL_AT=checkpoint:1`, the seam in polar.trainer.train);
3. --resume: step 1 is published from its checkpoint and its line appended — not trained again (the same files) —
   then step 2 trains and is killed after its publication, before its line (`publication:2`: on disk the same as a
   kill during publication, a checkpoint without a line; --resume publishes again whatever the server holds);
4. --resume: step 2's line is appended from its checkpoint; exit 0.
The optimizer's state goes through every stop: AdamW's step count in step 2's checkpoint is 2, not 1. The run uses
the learning knobs (issue 41): --clip-high, the adaptive entropy controller with a target no entropy reaches from
above (100 nats: its coefficient rises by 0.005 per optimizer step, so step 2's 0.010 says the controller came back
from step 1's checkpoint) and --advantage-norm mean, recorded in train.json and in each step's manifest.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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


# -- the run, stopped three times (tests 8–11) -------------------------------------------------------------------------

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


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _terminate_once_asked(args: list[str], run: Path) -> dict:
    """A --resume process, sent SIGTERM as soon as it has asked its serve for step 1's rollout: its exit code, its
    stderr, and whether the serve and the serve's proxy were still alive when it had exited."""
    proc = _start(args)
    requests, deadline = run / "rollout" / "requests", time.monotonic() + STEP_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline and not (requests / "step-0001.2.json").is_file():
        time.sleep(0.05)
    ready = json.loads((run / "rollout" / "ready.json").read_text())
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc)
    return {"exit_term": code, "err_term": err, "alive_after_term": [_alive(ready["pid"]), _alive(ready["proxy_pid"])]}


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=STEP_TIMEOUT)
    return proc.returncode, err


def run_with_kills(run: Path, args: list[str]) -> dict:
    """The four processes of the module docstring on `args` (a 2-step polar-train command line whose --out is
    `run`); what each left behind."""
    seen: dict = {}
    resume = ["--out", str(run), "--resume"]
    seen["killed_in_rollout"] = _kill_when_a_sample_finished(_start(args), run)
    seen["after_rollout_kill"] = _lines(run)
    seen.update(_terminate_once_asked(resume, run))
    seen["exit_checkpoint"], seen["err_checkpoint"] = _finish(_start(resume, {"POLAR_TRAIN_KILL_AT": "checkpoint:1"}))
    seen["ckpt1_files"] = _files(run / "checkpoints" / "step-0001")
    seen["after_checkpoint_kill"] = _lines(run)
    seen["exit_publication"], seen["err_publication"] = _finish(_start(resume, {"POLAR_TRAIN_KILL_AT":
                                                                               "publication:2"}))
    seen["after_publication_kill"] = _lines(run)
    seen["ckpt2_files"] = _files(run / "checkpoints" / "step-0002")
    seen["exit"], seen["err"] = _finish(_start(resume))
    return seen


RESUME_SEEN: dict = {}  # what run_with_kills saw, filled by the fixture


@pytest.fixture(scope="module")
def trained(dev_server, tmp_path_factory):
    """The 2-step run, carried through four processes by kills at each resumable point (test_8–test_11 below):
    what tests 1–4 check holds for a run that was stopped three times."""
    run = tmp_path_factory.mktemp("train") / "run"
    try:
        seen = run_with_kills(run, [str(TRAIN_TASK), "--agent", ANSWER_AGENT, "--model", str(TINY), "--out", str(run),
                                    "--steps", "2", "--samples", "4", "--lr", str(LR), "--weight-decay", str(WD),
                                    "--dtype", "float32", "--vllm-run-file", dev_server.run_file,
                                    "--rollout-opt=--sandbox=none", "--rollout-opt=--skip-preflight",
                                    "--rollout-opt=--parallel=2", "--clip-high", "0.28", "--entropy-target", "100",
                                    "--advantage-norm", "mean"])
    finally:
        _restore(dev_server)
    proc = subprocess.CompletedProcess(POLAR_TRAIN, seen["exit"], "", seen["err"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    RESUME_SEEN.update(seen)
    return run, proc


def test_1_every_step_ran_every_stage(trained):
    run, proc = trained
    lines = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
    assert [ln["step"] for ln in lines] == [1, 2]
    for ln in lines:
        assert ln["samples"] == 4 and sum(ln["statuses"].values()) == 4
        assert ln["reward_mean"] is not None and ln["tokens_trainable"] > 0
        assert ln["tokens_forward"] >= ln["tokens_trainable"]
        assert set(ln["seconds"]) == {"rollout", "process", "verify", "train", "checkpoint", "reload"}
        assert ln["seconds"]["checkpoint"] is None  # both lines come from their checkpoints (killed, resumed)
        assert all(v >= 0 for k, v in ln["seconds"].items() if k != "checkpoint")
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
    ([str(TRAIN_TASK), "--agent", SDK_AGENT, "--model", str(TINY), "--out", "X", "--clip-high", "0"],
     "--clip-high 0.0: must be > 0"),
    ([str(TRAIN_TASK), "--agent", SDK_AGENT, "--model", str(TINY), "--out", "X", "--entropy-coef", "-0.1"],
     "--entropy-coef and --entropy-target must be ≥ 0"),
    ([str(TRAIN_TASK), "--agent", SDK_AGENT, "--model", str(TINY), "--out", "X", "--normalize", "sequence"],
     "--normalize"),
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
        "polar-train needs the trainer environment (torch, transformers): scripts/setup --train, then "
        ".venv-train/bin/polar-train")
    assert torch.__version__  # this session's own environment has it


# -- --resume after a kill at each stage (issue 23) --------------------------------------------------------------------

def test_8_a_kill_in_rollout_keeps_the_finished_samples(trained):
    run, _ = trained
    seen = RESUME_SEEN
    assert seen["after_rollout_kill"] == []
    kept = {(r["task"], r["k"], r["attempt"]) for r in seen["killed_in_rollout"]}
    final = _results(run, 1)
    assert kept <= {(r["task"], r["k"], r["attempt"]) for r in final}
    for task, k, _ in kept:  # not run again: one attempt line for each sample finished before the kill
        assert sum(1 for r in final if (r["task"], r["k"]) == (task, k)) == 1
    assert {r["k"] for r in final} == {0, 1, 2, 3}


def test_8b_sigterm_ends_the_services_and_says_how_to_go_on(trained):
    seen = RESUME_SEEN
    assert seen["exit_term"] == 128 + signal.SIGTERM, seen["err_term"][-3000:]
    assert seen["err_term"].splitlines()[-1].startswith("polar-train: SIGTERM received: stopped"), seen["err_term"]
    assert "--resume" in seen["err_term"].splitlines()[-1]
    assert seen["alive_after_term"] == [False, False]  # the serve and its proxy ended before polar-train did


def test_9_a_kill_after_the_checkpoint_does_not_train_the_step_again(trained):
    run, _ = trained
    seen = RESUME_SEEN
    assert seen["exit_checkpoint"] == -signal.SIGKILL, seen["err_checkpoint"][-3000:]
    assert seen["after_checkpoint_kill"] == []
    assert "trained and saved before the stop; publishing step-0001" in seen["err_publication"]
    assert _files(run / "checkpoints" / "step-0001") == seen["ckpt1_files"]  # the same files: not retrained
    assert [ln["step"] for ln in seen["after_publication_kill"]] == [1]


def test_10_a_kill_in_publication_appends_the_line_once(trained):
    run, _ = trained
    seen = RESUME_SEEN
    assert seen["exit_publication"] == -signal.SIGKILL, seen["err_publication"][-3000:]
    assert seen["exit"] == 0, seen["err"][-5000:]
    assert "publishing step-0002" in seen["err"]
    assert _files(run / "checkpoints" / "step-0002") == seen["ckpt2_files"]
    lines = _lines(run)
    assert [ln["step"] for ln in lines] == [1, 2]
    assert [ln["weight_version"] for ln in lines] == ["step-0000", "step-0001"]
    assert all(ln["published"] and ln["updates"] == 1 for ln in lines)


def test_11_the_optimizer_state_survives_every_stop(trained):
    run, _ = trained
    state = torch.load(run / "checkpoints" / "step-0002" / "trainer_state.pt", weights_only=True)
    steps = {float(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {2.0}, steps  # one update in each step, the moments carried over
    assert state["step"] == 2 and state["cursor"] == 3
    assert json.loads(state["line"])["step"] == 2


def test_12_the_learning_knobs_reach_the_steps_and_survive_every_stop(trained):
    run, _ = trained
    plan = json.loads((run / "train.json").read_text())
    assert (plan["clip_high"], plan["entropy_target"], plan["advantage_norm"]) == (0.28, 100.0, "mean")
    lines = _lines(run)
    assert [ln["entropy_coef"] for ln in lines] == [pytest.approx(0.005), pytest.approx(0.010)]
    for ln in lines:
        assert ln["clip_share_low"] + ln["clip_share_high"] == pytest.approx(ln["clip_share"])
        manifest = json.loads((run / "steps" / f"{ln['step']:04d}" / "out" / "manifest.json").read_text())
        assert manifest["advantage_norm"] == "mean"
    state = torch.load(run / "checkpoints" / "step-0002" / "trainer_state.pt", weights_only=True)
    assert state["entropy"][0] == pytest.approx(0.010) and 0 < state["entropy"][1] < 100
