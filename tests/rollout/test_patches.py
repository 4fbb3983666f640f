"""The patch as a product (polar.rollout.patches): final.diff as a git patch against tests/config.json's base_commit
(else the start state's HEAD), the tree diff otherwise; predictions.jsonl in SWE-bench's shape; what a reward line
carries.

1.x  write_final_diff: a repository start state (base from the record, else HEAD), a plain one, a base git lacks
2.x  predictions.jsonl and the carried keys, over a RUN written by hand
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polar.rollout import patches
from tests.rollout.test_gitpatch import git

pytestmark = pytest.mark.unit


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "start"
    root.mkdir()
    (root / "m.py").write_text("A = 1\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    (root / "m.py").write_text("A = 2\n")
    git(root, "commit", "-q", "-am", "head")
    return root


def test_1_1_a_repository_start_state_gives_a_git_patch_against_the_records_base(repo, tmp_path):
    app = tmp_path / "app"
    shutil.copytree(repo, app)
    (app / "new.py").write_text("B = 3\n")
    base = git(repo, "rev-parse", "HEAD~1")
    out = tmp_path / "final.diff"
    assert patches.write_final_diff(out, repo, app, {"base_commit": base}) == {"kind": "git", "base": base}
    text = out.read_text()
    assert "-A = 1\n+A = 2\n" in text and "+++ b/new.py" in text and "diff --git a/new.py b/new.py" in text
    head = git(repo, "rev-parse", "HEAD")
    assert patches.write_final_diff(out, repo, app, {}) == {"kind": "git", "base": head}
    assert "A = 2" not in out.read_text() and "+++ b/new.py" in out.read_text()


def test_1_2_a_plain_start_state_or_a_missing_base_gives_the_tree_diff(repo, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "m.py").write_text("A = 1\n")
    app = tmp_path / "app"
    shutil.copytree(plain, app)
    (app / "m.py").write_text("A = 5\n")
    out = tmp_path / "final.diff"
    assert patches.write_final_diff(out, plain, app, {}) == {"kind": "tree"}
    assert "+A = 5" in out.read_text()
    got = patches.write_final_diff(out, repo, app, {"base_commit": "f" * 40})
    assert got["kind"] == "tree" and f"the base commit {'f' * 40} is not in" in got["git_error"]


def sample(run: Path, task: str, k: int, kind: str, diff: str, **line) -> dict:
    d = run / "samples" / task / str(k) / "0"
    d.mkdir(parents=True)
    (d / "final.diff").write_text(diff)
    (d / "sample.json").write_text(json.dumps({"final_diff": {"kind": kind}}))
    return {"task": task, "k": k, "attempt": 0, "session": f"r/{task}/{k}/0", "status": "completed", **line}


def test_2_1_predictions_hold_each_git_patch_in_swebenchs_shape(tmp_path):
    lines = [sample(tmp_path, "fix-a", 0, "git", "diff --git a/x b/x\n", reward=1.0),
             sample(tmp_path, "fix-a", 1, "git", "", reward=0.0),
             sample(tmp_path, "toy", 0, "tree", "--- a/y\n", reward=1.0)]
    records = {"fix-a": {"instance_id": "polar__fix-a-1"}}
    assert patches.write_predictions(tmp_path, lines, records, "tiny-model") == 2
    rows = [json.loads(x) for x in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert rows == [{"instance_id": "polar__fix-a-1", "model_name_or_path": "tiny-model",
                     "model_patch": "diff --git a/x b/x\n", "k": 0, "session": "r/fix-a/0/0"},
                    {"instance_id": "polar__fix-a-1", "model_name_or_path": "tiny-model", "model_patch": "", "k": 1,
                     "session": "r/fix-a/1/0"}]
    assert patches.write_predictions(tmp_path, lines[2:], records, "m") == 0
    assert not (tmp_path / "predictions.jsonl").exists()


def test_2_2_an_swe_samples_reward_line_carries_resolved_and_its_git_patch(tmp_path):
    swe = sample(tmp_path, "fix-a", 0, "git", "diff --git a/x b/x\n", reward=1.0,
                 reward_details={"reward": 1, "graded": 1.0, "resolved": True})
    toy = sample(tmp_path, "toy", 0, "tree", "--- a/y\n", reward=1.0)
    graded = sample(tmp_path, "graded", 0, "tree", "", reward=0.5, reward_details={"graded": 0.5, "resolved": False})
    assert patches.carried(tmp_path, swe) == {"resolved": True, "patch": "diff --git a/x b/x\n"}
    assert patches.carried(tmp_path, graded) == {"resolved": False}
    assert patches.carried(tmp_path, toy) == {}  # not an SWE sample: its line stays as it was


def test_2_3_a_tasks_identity_is_its_record_else_its_id(tmp_path):
    (tmp_path / "t" / "tests").mkdir(parents=True)
    assert patches.task_record(tmp_path / "t") == {}
    (tmp_path / "t" / "tests" / "config.json").write_text('{"instance_id": "o__r-7", "base_commit": "abc"}')
    rec = patches.task_record(tmp_path / "t")
    assert patches.instance_id("t", rec) == "o__r-7" and patches.instance_id("t", {}) == "t"


def test_2_4_the_model_name_is_the_one_the_backend_served_the_runs_calls_as(tmp_path):
    from tests.processor.synth import session_records, write_flows

    recs = session_records("run-a/t/0/0", ["turn", "turn"], seed=1) + session_records("other/t/0/0", ["turn"], seed=2)
    for r in recs:
        r["model_served"] = "served-a" if r["session"].startswith("run-a/") else "served-other"
    write_flows(str(tmp_path / "flows"), recs)
    assert patches.served_model(str(tmp_path / "flows"), "run-a") == "served-a"
    assert patches.served_model(str(tmp_path / "flows"), "run-b") is None
