"""Real agents, unmodified, on SWE tasks in their images (examples/swe, --sandbox docker).

- Codex on slugkit and Claude Code on cfgmerge, driven by the scripted policy (tests/rollout/cli_policy.py) through
  each CLI's own shell tool: samples 0 and 1 fix the bug — `git apply` of the task's gold patch, which the policy
  embeds in its command (the agent never sees tests/) — and sample 2 runs `ls`. The fixing samples are resolved
  (reward 1) and their final.diff is the gold patch's change; sample 2 scores 0 with an empty patch.
  polar-process with `--sft-min-reward 1` keeps exactly the resolved sessions' rows, each carrying its patch.
- Pi with the real tiny vLLM (tests/e2e's extra-EOS server) on one task: whatever the random model does, the sample
  ends completed or agent_error — never infra_error — with the grader's reward (0 expected: the F2P tests fail) and
  its patch recorded (predictions.jsonl, rewards.jsonl) as git diffs against base_commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import require_cli
from tests.rollout.cli_policy import CliPolicy
from tests.rollout.rollout_support import explain, latest, results, rollout, rollout_env
from tests.rollout.swe_support import SWE, failing, record, swe_base  # noqa: F401 — swe_base: the fixture
from tests.support.vllm_server import shared_extra_eos_vllm

pytestmark = pytest.mark.integration

TIMEOUT = 600
# harness → the task it fixes, and a line only that task's instruction holds (the policy's way to know the task)
AGENTS = {"codex": ("slugkit", "slugify joins words with underscores"),
          "claude-code": ("cfgmerge", "Resolving one profile changes the configuration")}


def solving_command(task: str) -> str:
    """The gold patch applied through the agent's shell, in the image's /testbed."""
    patch = record(task)["patch"]
    assert "POLAR_PATCH_END" not in patch
    return f"cd /testbed && git apply --whitespace=nowarn <<'POLAR_PATCH_END'\n{patch}POLAR_PATCH_END\n"


def _changes(patch: str) -> tuple[list[str], list[str]]:
    """A patch's files and its added/removed lines (context and hunk positions aside)."""
    files = sorted(ln.split(" b/", 1)[1] for ln in patch.splitlines() if ln.startswith("diff --git "))
    lines = [ln for ln in patch.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return files, lines


def _task_dir(tmp_path: Path, task: str) -> Path:
    import shutil

    dest = tmp_path / "tasks" / task
    shutil.copytree(SWE / task, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest.parent


def _why(run: Path, proc) -> str:
    out = [explain(proc)]
    for p in sorted(run.glob("samples/*/*/*/*")):
        if p.name in ("agent.stdout", "agent.stderr", "verifier.log"):
            out.append(f"--- {p.relative_to(run)}\n{p.read_text(errors='replace')[-1500:]}")
    return "\n".join(out)


@pytest.mark.parametrize("harness", list(AGENTS))
def test_1_a_cli_fixes_the_bug_with_its_own_tools_and_sft_keeps_the_resolved(harness, swe_base, cache_dir, tmp_path,
                                                                              upstream, monkeypatch):
    require_cli(harness)
    task, mark = AGENTS[harness]
    policy = CliPolicy(harness, tasks={task: (mark, solving_command(task))}).bind(upstream)
    monkeypatch.setattr(upstream, "_next_reply", policy, raising=False)
    run = tmp_path / "run"
    proc = rollout(str(_task_dir(tmp_path, task)), "--agent", harness, "--out", str(run), "--sandbox", "docker",
                   "--upstream", upstream.base_url, "--samples", "3", "--parallel", "3", "--run-id",
                   f"swe-{harness}", "--agent-timeout", "240", "--skip-preflight", "--image-map",
                   f"@{swe_base['map']}", "--build-network", "none", "--sft-min-reward", "1", timeout=TIMEOUT,
                   env=rollout_env(DOCKER_HOST=swe_base["host"]))
    why = _why(run, proc)
    final = latest(results(run))
    assert {key: (ln["status"], ln["reward"]) for key, ln in final.items()} == {
        (task, 0): ("completed", 1.0), (task, 1): ("completed", 1.0), (task, 2): ("completed", 0.0)}, why
    assert sorted(x for x in policy.seen[task] if x.startswith(("solve", "noop"))) == ["noop:2", "solve:0",
                                                                                       "solve:1"], policy.seen
    rec = record(task)
    assert failing(final[(task, 2)]["reward_details"]) == sorted(rec["FAIL_TO_PASS"]), why
    predictions = {p["k"]: p for p in map(json.loads, (run / "predictions.jsonl").open())}
    for k in (0, 1):
        assert _changes(predictions[k]["model_patch"]) == _changes(rec["patch"]), predictions[k]["model_patch"]
    assert predictions[2]["model_patch"] == ""  # `ls` changed nothing; the CLI's own state dirs are not the patch
    # sft.jsonl: the resolved sessions' rows only, each with its patch (the rows of sample 2 left out)
    rows = [json.loads(x) for x in (run / "out" / "sft.jsonl").read_text().splitlines()]
    patches = {predictions[k]["model_patch"] for k in (0, 1)}
    assert rows and all(r["resolved"] is True and r["patch"] in patches for r in rows), rows
    with_solution = [r for r in rows if any("POLAR_PATCH_END" in json.dumps(m) for m in r["messages"])]
    assert len(with_solution) >= 2, [r["messages"][-1] for r in rows]  # both fixing sessions are there


@pytest.mark.vllm
def test_2_pi_with_the_tiny_model_gets_its_reward_and_its_patch_recorded(swe_base, cache_dir, tmp_path):
    require_cli("pi")
    server, gen = shared_extra_eos_vllm()
    task = "slugkit"
    run = tmp_path / "run"
    proc = rollout(str(_task_dir(tmp_path, task)), "--agent", "pi", "--out", str(run), "--sandbox", "docker",
                   "--upstream", server.base_url, "--samples", "1", "--run-id", "swe-pi-tiny", "--agent-timeout",
                   "240", "--skip-preflight", "--image-map", f"@{swe_base['map']}", "--build-network", "none",
                   f"--process-opt=--tokenizer={gen}", timeout=TIMEOUT, env=rollout_env(DOCKER_HOST=swe_base["host"]))
    why = _why(run, proc)
    line = latest(results(run))[(task, 0)]
    assert line["status"] in ("completed", "agent_error") and line["reward"] is not None, why
    details = line["reward_details"]
    assert details["f2p_total"] == len(record(task)["FAIL_TO_PASS"]) and details["reward"] == line["reward"], why
    prediction = json.loads((run / "predictions.jsonl").read_text().splitlines()[0])
    assert prediction["instance_id"] == record(task)["instance_id"]
    assert (run / "samples" / task / "0" / "0" / "final.diff").read_text() == prediction["model_patch"]
    carried = {r["session"]: r for r in map(json.loads, (run / "rewards.jsonl").open())}[line["session"]]
    assert carried["patch"] == prediction["model_patch"] and carried["resolved"] is (line["reward"] == 1.0)
