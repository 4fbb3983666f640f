"""The examples/swe tasks as tasks: each is a small real package (3+ modules, 150-500 lines, its own passing test
suite) with SWE-bench's record (1-3 FAIL_TO_PASS, 5-10 PASS_TO_PASS), an issue that names no test; graded on this
host by its own tests/grade.py, the start state fails every F2P test and passes every P2P test, the gold patch passes
them all. (Through the image sandboxes: tests/rollout/test_swe_tasks.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.rollout.swe_support import SWE, TASKS, apply_patch, base_tree, failing, record

pytestmark = pytest.mark.unit

KEYS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")


def test_six_tasks_of_different_kinds():
    kinds = {re.search(r'"swe", "python", "([^"]+)"', (SWE / t / "task.toml").read_text()).group(1) for t in TASKS}
    assert len(TASKS) >= 6 and {"off-by-one", "wrong-default", "edge-case", "two-modules",
                                "new-function"} <= kinds, kinds


@pytest.mark.parametrize("task", TASKS)
def test_task_shape(task):
    rec = record(task)
    assert tuple(rec)[:len(KEYS)] == KEYS and rec["instance_id"] == f"polar-swe__{task}-1"
    assert 1 <= len(rec["FAIL_TO_PASS"]) <= 3 and 5 <= len(rec["PASS_TO_PASS"]) <= 10
    assert not set(rec["FAIL_TO_PASS"]) & set(rec["PASS_TO_PASS"])
    repo = SWE / task / "environment" / "repo"
    modules = [p for p in (repo / task).glob("*.py") if p.name != "__init__.py"]
    lines = sum(len(p.read_text().splitlines()) for p in repo.rglob("*.py"))
    assert len(modules) >= 3 and 150 <= lines <= 500, (len(modules), lines)
    assert len({p.split("/")[1] for p in re.findall(r"^diff --git a/(\S+)", rec["patch"], re.M)}) >= 1
    issue = (SWE / task / "instruction.md").read_text()
    for test in rec["FAIL_TO_PASS"] + rec["PASS_TO_PASS"]:
        name = test.split("::")[-1].split("[")[0]
        assert name not in issue and test.split("::")[0] not in issue
    assert "Dockerfile" not in issue and "FAIL_TO_PASS" not in issue


@pytest.mark.parametrize("task", TASKS)
def test_start_fails_every_f2p_and_gold_passes_all(task, tmp_path):
    rec = record(task)
    suite = subprocess.run([sys.executable, "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                           cwd=base_tree(task, tmp_path / "suite"), capture_output=True, text=True)
    assert suite.returncode == 0, suite.stdout[-2000:]  # the package's own suite passes at base_commit
    results = {}
    for state in ("start", "gold"):
        tree = base_tree(task, tmp_path / state / "testbed")
        if state == "gold":
            apply_patch(tree, rec["patch"])
        out = tmp_path / state / "verifier"
        proc = subprocess.run([sys.executable, str(SWE / task / "tests" / "grade.py"), "--testbed", str(tree),
                               "--tests", str(SWE / task / "tests"), "--out", str(out)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        results[state] = json.loads((out / "reward.json").read_text())
        assert (out / "reward.txt").read_text() == f"{int(results[state]['reward'])}\n"
    start, gold = results["start"], results["gold"]
    assert failing(start) == sorted(rec["FAIL_TO_PASS"])
    assert (start["reward"], start["graded"], start["resolved"]) == (0.0, 0.0, False)
    assert (start["p2p_passed"], start["p2p_total"]) == (len(rec["PASS_TO_PASS"]),) * 2
    assert failing(gold) == [] and (gold["reward"], gold["graded"], gold["resolved"]) == (1.0, 1.0, True)
    assert (gold["f2p_passed"], gold["f2p_total"]) == (len(rec["FAIL_TO_PASS"]),) * 2
