"""polar-rollout with each real agent CLI (issue 15): the scripted upstream acts as a policy (tests/rollout/
cli_policy.py) that drives the CLI's own shell tool — it reads POLAR_SAMPLE through `echo`, solves the task in samples
0 and 1 and does nothing useful in 2 and 3 — on two example tasks (hello-file, release-checksums), verified by their
own verifiers. K=2 per CLI through bwrap (every sample solved: reward 1.0, advantage 0); K=4 for Claude Code, whose
groups then get advantages exactly +1 / -1; Pi once more through Docker; Claude Code once more without a sandbox with
POLAR_TEST_ALL_CLIS=1. The preflight runs in the Claude Code K=4 and the Docker run (its canary is the CLI's own)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from tests.e2e.conftest import require_cli
from tests.rollout.cli_policy import CliPolicy
from tests.rollout.rollout_support import explain, latest, results, rewards, rollout, rollout_env
from tests.support.gateway import ROOT
from tests.support.need import need_sandbox

pytestmark = pytest.mark.e2e

TASKS = [str(Path(ROOT) / "examples" / "tasks" / t) for t in ("hello-file", "release-checksums")]
TIMEOUT = 300


def _bwrap() -> None:
    need_sandbox("bwrap")


def _run(tmp_path, upstream, monkeypatch, agent: str, harness: str, *, samples: int, box: str, run_id: str,
         preflight: bool = False, env: dict | None = None):
    """One run, every sample at once (a CLI's samples mostly wait on its own start and shell tool). The preflight
    runs where `preflight` says so: its canary is one more sample of the same CLI before the others start."""
    require_cli(harness)
    policy = CliPolicy(harness).bind(upstream)
    monkeypatch.setattr(upstream, "_next_reply", policy, raising=False)
    run = tmp_path / "run"
    proc = rollout(*TASKS, "--agent", agent, "--out", str(run), "--sandbox", box, "--upstream", upstream.base_url,
                   "--samples", str(samples), "--parallel", str(2 * samples), "--run-id", run_id, "--agent-timeout",
                   "120", *(() if preflight else ("--skip-preflight",)), timeout=TIMEOUT, env=env)
    policy.preflight = preflight
    return run, proc, policy


def _explain(run: Path, proc, policy) -> str:
    out = [explain(proc), f"--- policy: {policy.seen} canary={policy.canary} side={policy.side}"]
    for p in sorted((run / "samples").glob("*/*/*/agent.std*")) if (run / "samples").is_dir() else []:
        out.append(f"--- {p.relative_to(run)}\n{p.read_text(errors='replace')[-1500:]}")
    pre = run / "preflight" / "sample"
    for p in sorted(pre.glob("agent.std*")) if pre.is_dir() else []:
        out.append(f"--- {p.relative_to(run)}\n{p.read_text(errors='replace')[-1500:]}")
    return "\n".join(out)


def _check(run: Path, proc, policy, *, samples: int, run_id: str, box: str) -> None:
    why = _explain(run, proc, policy)
    assert proc.returncode == 0, why
    final = latest(results(run))
    tasks = ("hello-file", "release-checksums")
    want = {(t, k): ("completed", 1.0 if k in policy.solves else 0.0) for t in tasks for k in range(samples)}
    assert {key: (ln["status"], ln["reward"]) for key, ln in final.items()} == want, why
    for (task, k), line in final.items():
        assert line["session"] == f"{run_id}/{task}/{k}/0" and line["sandbox"] == box
        assert line["calls"] >= 3 and line["trainable_tokens"] > 0, line  # probe, solve/noop, final answer
    for task in tasks:  # the policy really read each sample's POLAR_SAMPLE through the CLI's shell tool
        kinds = policy.seen.get(task, [])
        assert sorted(x for x in kinds if x.startswith(("solve", "noop"))) == sorted(
            f"{'solve' if k in policy.solves else 'noop'}:{k}" for k in range(samples)), (task, kinds)
        assert kinds.count("probe") == kinds.count("final") == samples, (task, kinds)
    if policy.preflight:  # the preflight's canary sample ran the same CLI in the same sandbox
        assert policy.canary >= 1 and (run / "preflight" / "sample" / "sample.json").is_file(), why
    else:
        assert policy.canary == 0 and not (run / "preflight").exists(), why
    assert sorted((r["session"], r["reward"]) for r in rewards(run)) == sorted(
        (ln["session"], ln["reward"]) for ln in final.values())
    seqs = pl.read_parquet(run / "out" / "sequences.parquet")
    assert set(seqs["session"]) == {ln["session"] for ln in final.values()}
    # every sequence of a session (side chains included) carries its group's advantage
    spread = len({k in policy.solves for k in range(samples)}) > 1
    for row in seqs.iter_rows(named=True):
        k = int(row["session"].split("/")[2])
        want_adv = (1.0 if k in policy.solves else -1.0) if spread else 0.0
        assert row["advantage"] == want_adv, (row["session"], row["advantage"], row["flags"])
    doc = json.loads((run / "run.json").read_text())
    assert doc["isolation_safe"] is (box != "none")


@pytest.mark.parametrize("harness", ["codex", "gemini-cli", "qwen-code", "pi"])
def test_1_cli_rollout_two_tasks_k2_bwrap(tmp_path, upstream, monkeypatch, harness):
    _bwrap()
    run_id = f"cli-{harness}"
    run, proc, policy = _run(tmp_path, upstream, monkeypatch, harness, harness, samples=2, box="bwrap",
                             run_id=run_id)
    _check(run, proc, policy, samples=2, run_id=run_id, box="bwrap")


def test_2_claude_code_rollout_two_tasks_k4_bwrap_advantages_plus_minus_one(tmp_path, upstream, monkeypatch):
    _bwrap()
    run, proc, policy = _run(tmp_path, upstream, monkeypatch, "claude-code", "claude-code", samples=4, box="bwrap",
                             run_id="cli-claude", preflight=True)
    _check(run, proc, policy, samples=4, run_id="cli-claude", box="bwrap")


def test_3_claude_code_rollout_two_tasks_k2_no_sandbox(tmp_path, upstream, monkeypatch):
    """The same CLI on the host (`--sandbox none`: the runner's environment, not the sandbox's). Not in CI's default
    run (its time; tests/rollout/test_runner.py runs `--sandbox none` with the Python agent): POLAR_TEST_ALL_CLIS=1."""
    if os.environ.get("POLAR_TEST_ALL_CLIS") != "1":
        pytest.skip("POLAR_TEST_ALL_CLIS=1 runs it (kept out of CI for its time)")
    run, proc, policy = _run(tmp_path, upstream, monkeypatch, "claude-code", "claude-code", samples=2, box="none",
                             run_id="cli-claude-none")
    _check(run, proc, policy, samples=2, run_id="cli-claude-none", box="none")


def test_4_pi_rollout_two_tasks_k2_docker(tmp_path, upstream, monkeypatch, dockerd):
    run, proc, policy = _run(tmp_path, upstream, monkeypatch, "pi", "pi", samples=2, box="docker",
                             run_id="cli-pi-docker", preflight=True, env=rollout_env(DOCKER_HOST=dockerd))
    _check(run, proc, policy, samples=2, run_id="cli-pi-docker", box="docker")
