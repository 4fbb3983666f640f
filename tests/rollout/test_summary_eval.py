"""summary.json's evaluation (rollout/summary.py over polar.records.estimators): resolved_rate, resolved_ci95 and
pass_at overall and per task, samples without a reward left out of n and counted, each task's time limits; and the
summary's line. Two tasks, K = 3, results written by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.rollout.summary import RunShape, summary_doc, summary_lines

pytestmark = pytest.mark.unit


def line(task, k, status, reward, details=None, attempt=0):
    return {"task": task, "k": k, "attempt": attempt, "status": status, "reward": reward,
            "reward_details": details, "session": f"r/{task}/{k}/{attempt}", "group": f"r/{task}"}


def test_1_1_the_evaluation_block_and_its_line(tmp_path):
    lines = [line("a", 0, "completed", 1.0), line("a", 1, "completed", 0.0),
             line("a", 2, "infra_error", None), line("a", 2, "completed", 1.0, attempt=1),  # the retry decides
             line("b", 0, "completed", 1.0, {"reward": 1, "graded": 1.0, "resolved": False}),
             line("b", 1, "verifier_error", None), line("b", 2, "agent_timeout", 0.0)]
    shape = RunShape(run_dir=Path(tmp_path), run_id="r", task_ids=["a", "b"], samples=3, agent="x",
                     sandbox="docker", no_process=True,
                     time_limits={"a": {"agent_s": 600.0, "verifier_s": 600.0}, "b": {"agent_s": 900, "verifier_s": 180}})
    doc = summary_doc(shape, lines, None, False)
    # a: n=3, c=2 → 2/3, pass@2 = 1 − C(1,2)/C(3,2) = 1, pass@3 = 1; b: n=2 (one without reward), c=0
    assert doc["per_task"]["a"]["pass_at"] == pytest.approx({"1": 2 / 3, "2": 1.0, "3": 1.0})
    assert doc["per_task"]["b"]["pass_at"] == {"1": 0.0, "2": 0.0}
    assert (doc["per_task"]["b"]["resolved"], doc["per_task"]["b"]["unrewarded"]) == (0, 1)
    assert doc["per_task"]["b"]["time_limits"] == {"agent_s": 900, "verifier_s": 180}
    assert doc["resolved_rate"] == pytest.approx(1 / 3) and doc["unrewarded"] == 1
    assert doc["pass_at"] == pytest.approx({"1": 1 / 3, "2": 0.5, "3": 1.0})  # pass@3: only a has 3 counted
    assert doc["resolved_ci95"] == pytest.approx([0.0, 2 / 3])  # two tasks: resampled means 0, 1/3, 2/3
    text = "\n".join(summary_lines(shape, doc))
    assert "resolved  rate 0.333 (95% interval 0.000–0.667, bootstrap over tasks), pass@1 0.333, pass@3 1.000; " \
           "1 sample(s) without a reward left out" in text
