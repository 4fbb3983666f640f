"""Every examples/swe task through polar-rollout in its own image, under --sandbox docker and bwrap: one run per
sandbox, two samples a task — sample 0 leaves the start state (reward 0: reward.json fails exactly the F2P tests
and passes every P2P test), sample 1 runs solution/solve.sh (reward 1, every test passing). The agent
(tests/examples/swe/swe_agent.py) prints the HEAD it starts at: the image's /testbed is at tests/config.json's
base_commit. The tasks build FROM the SWE base (conftest.swe_base) with no build network."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.rollout.swe_support import SWE, TASKS, failing, record, swe_base  # noqa: F401 — swe_base: the fixture
from tests.rollout.rollout_support import explain, latest, results, rollout, rollout_env
from tests.support.need import need_sandbox

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
TIMEOUT = 500


def swe_copy(root: Path) -> Path:
    """examples/swe's tasks, each with the test agent and its solve.sh in agent/ (the one extension the tests add)."""
    dest = root / "swe"
    for task in TASKS:
        shutil.copytree(SWE / task, dest / task, ignore=shutil.ignore_patterns("__pycache__"))
        (dest / task / "agent").mkdir()
        shutil.copyfile(HERE / "swe_agent.py", dest / task / "agent" / "swe_agent.py")
        shutil.copyfile(SWE / task / "solution" / "solve.sh", dest / task / "agent" / "solve.sh")
    return dest


@pytest.mark.parametrize("box", ["docker", "bwrap"])
def test_start_state_scores_0_and_gold_patch_scores_1(box, swe_base, cache_dir, tmp_path, upstream):
    if box == "bwrap":
        need_sandbox("bwrap")
    run = tmp_path / "run"
    proc = rollout(str(swe_copy(tmp_path)), "--agent", "python:swe_agent:run", "--out", str(run), "--sandbox", box,
                   "--upstream", upstream.base_url, "--samples", "2", "--parallel", "4", "--run-id", f"swe-{box}",
                   "--agent-timeout", "120", "--skip-preflight", "--no-process", "--image-map",
                   f"@{swe_base['map']}", "--build-network", "none", timeout=TIMEOUT,
                   env=rollout_env(DOCKER_HOST=swe_base["host"]))
    final = latest(results(run))
    why = explain(proc) + "".join(f"\n{key}: {line.get('error')}" for key, line in final.items()) + "".join(
        f"\n--- {p.relative_to(run)}\n{p.read_text(errors='replace')[-1500:]}"
        for p in sorted((run / "samples").glob("*/*/*/*")) if p.name in ("agent.stdout", "verifier.log"))
    assert {key: (line["status"], line["reward"]) for key, line in final.items()} == {
        (task, k): ("completed", float(k)) for task in TASKS for k in (0, 1)}, why
    for task in TASKS:
        rec = record(task)
        start, gold = final[(task, 0)]["reward_details"], final[(task, 1)]["reward_details"]
        assert failing(start) == sorted(rec["FAIL_TO_PASS"]) and start["p2p_passed"] == len(rec["PASS_TO_PASS"])
        assert failing(gold) == [] and gold["resolved"] is True and gold["graded"] == 1.0
        for k in (0, 1):
            log = (run / "samples" / task / str(k) / "0" / "agent.stdout").read_text()
            assert f"HEAD {rec['base_commit']} in /testbed" in log, log
    doc = json.loads((run / "run.json").read_text())
    assert all(env["image_id"] and env["error"] is None for env in doc["environments"].values()), doc["environments"]
    _check_patches(run, final)


def _changes(patch: str) -> tuple[list[str], list[str]]:
    """A patch's files and its added/removed lines (context and hunk positions aside)."""
    files = sorted(ln.split(" b/", 1)[1] for ln in patch.splitlines() if ln.startswith("diff --git "))
    lines = [ln for ln in patch.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return files, lines


def _check_patches(run: Path, final: dict) -> None:
    """final.diff is the agent's change against base_commit as a git patch: empty for the start state, the gold
    patch's change for solve.sh; predictions.jsonl holds both in SWE-bench's shape; rewards.jsonl carries them."""
    predictions = {(p["instance_id"], p["k"]): p for p in map(json.loads, (run / "predictions.jsonl").open())}
    rewards = {r["session"]: r for r in map(json.loads, (run / "rewards.jsonl").open())}
    for task in TASKS:
        rec = record(task)
        start, gold = predictions[(rec["instance_id"], 0)], predictions[(rec["instance_id"], 1)]
        assert start["model_patch"] == "" and start["model_name_or_path"] == gold["model_name_or_path"] != "unknown"
        assert _changes(gold["model_patch"]) == _changes(rec["patch"]), gold["model_patch"]
        sample = json.loads((run / "samples" / task / "1" / "0" / "sample.json").read_text())
        assert sample["final_diff"] == {"kind": "git", "base": rec["base_commit"]}
        carried = rewards[final[(task, 1)]["session"]]
        assert carried["resolved"] is True and carried["patch"] == gold["model_patch"]
        assert rewards[final[(task, 0)]["session"]]["resolved"] is False
