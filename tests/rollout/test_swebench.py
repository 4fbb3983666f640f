"""polar-tasks from-swebench (rollout/swebench.py): SWE-bench / SWE-Gym records to tasks in Harbor's layout, and
its refusals, one line each with exit 2 and nothing written. (The tasks it writes run in their images:
tests/examples/swe/test_adapter_layout.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from polar.rollout import swebench

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SWE = ROOT / "examples" / "swe"
BASE = "7db7cf9758b351aeb8bd0b7f8c65e4319f524a20"


def records(*tasks: str, dataset_form: bool = False) -> list[dict]:
    """The example tasks' records as SWE-bench publishes them (problem_statement; with `dataset_form`, the test
    lists JSON-encoded as the published datasets hold them)."""
    out = []
    for task in tasks:
        rec = json.loads((SWE / task / "tests" / "config.json").read_text())
        rec["problem_statement"] = (SWE / task / "instruction.md").read_text()
        if dataset_form:
            rec["FAIL_TO_PASS"], rec["PASS_TO_PASS"] = json.dumps(rec["FAIL_TO_PASS"]), json.dumps(rec["PASS_TO_PASS"])
        out.append(rec)
    return out


def write_jsonl(path: Path, recs: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))
    return path


def polar_tasks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.rollout.swebench", *args], capture_output=True, text=True)


def test_three_records_become_three_tasks(tmp_path):
    recs = records("pagekit", "durations") + records("moneyfmt", dataset_form=True)
    recs[1].pop("patch")  # a record without the gold patch: no solution/
    src = write_jsonl(tmp_path / "records.jsonl", recs)
    proc = polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "tasks"), "--cpus", "2", "--memory-mb",
                       "2048", "--agent-timeout", "600")
    assert proc.returncode == 0 and proc.stdout.strip() == f"wrote 3 task(s) to {tmp_path / 'tasks'}", proc.stderr
    tasks = tmp_path / "tasks"
    assert sorted(p.name for p in tasks.iterdir()) == [
        "polar-swe__durations-1", "polar-swe__moneyfmt-1", "polar-swe__pagekit-1"]
    task = tasks / "polar-swe__pagekit-1"
    toml = tomllib.loads((task / "task.toml").read_text())
    assert toml["environment"] == {"docker_image": "swebench/sweb.eval.x86_64.polar-swe_1776_pagekit-1:latest",
                                   "cpus": 2, "memory_mb": 2048, "storage_mb": 10240}
    assert toml["agent"]["timeout_sec"] == 600 and toml["verifier"]["timeout_sec"] == 900
    assert toml["metadata"]["instance_id"] == "polar-swe__pagekit-1"
    assert (task / "instruction.md").read_text() == (SWE / "pagekit" / "instruction.md").read_text()
    assert (task / "tests" / "grade.py").read_text() == (ROOT / "rollout" / "swe_grade.py").read_text()
    assert (task / "tests" / "test.sh").read_text() == swebench.TEST_SH
    assert (task / "solution" / "solve.sh").read_text() == (SWE / "pagekit" / "solution" / "solve.sh").read_text()
    money = json.loads((tasks / "polar-swe__moneyfmt-1" / "tests" / "config.json").read_text())
    assert money["FAIL_TO_PASS"] == records("moneyfmt")[0]["FAIL_TO_PASS"]  # JSON-encoded lists read as lists
    assert not (tasks / "polar-swe__durations-1" / "solution").exists()
    assert json.loads((task / "tests" / "config.json").read_text())["base_commit"] == BASE


def test_image_pattern(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", records("pagekit"))
    proc = polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t"), "--image-pattern",
                       "registry.example:5000/swe/{repo}:{id}")
    assert proc.returncode == 0, proc.stderr
    toml = tomllib.loads((tmp_path / "t" / "polar-swe__pagekit-1" / "task.toml").read_text())
    assert toml["environment"]["docker_image"] == "registry.example:5000/swe/polar-swe/pagekit:polar-swe__pagekit-1"


def _bad(**change) -> dict:
    rec = records("pagekit")[0]
    for key, value in change.items():
        if value is None:
            rec.pop(key)
        else:
            rec[key] = value
    return rec


@pytest.mark.parametrize("lines, extra, expected", [
    ([_bad(problem_statement=None)], (), "line 1: no problem_statement (SWE-bench's record keys"),
    (["{not json"], (), "line 1: not JSON"),
    ([_bad(), _bad()], (), "line 2: instance_id polar-swe__pagekit-1 again (first on line 1)"),
    ([_bad(FAIL_TO_PASS=["test_bump (tests.VersionTests)"])], (), "not a pytest node id"),
    ([_bad(FAIL_TO_PASS=[])], (), "line 1: FAIL_TO_PASS is empty"),
    ([_bad(FAIL_TO_PASS="[not a list")], (), "FAIL_TO_PASS is a string that is not a JSON list"),
    ([_bad(instance_id="../escape")], (), "instance_id '../escape' is not a directory name"),
    ([_bad(base_commit="main")], (), "base_commit 'main' is not a full commit id"),
    ([_bad()], ("--image-pattern", "swe/{name}"), "--image-pattern 'swe/{name}' does not format"),
    ([], (), "no records"),
])
def test_bad_records_are_one_line_and_write_nothing(lines, extra, expected, tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", lines)
    proc = polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t"), *extra)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("polar-tasks: error: ") and expected in proc.stderr
    assert not (tmp_path / "t").exists()


def test_existing_tasks_need_force(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", records("pagekit"))
    assert polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t")).returncode == 0
    stale = tmp_path / "t" / "polar-swe__pagekit-1" / "stale.txt"
    stale.write_text("x")
    proc = polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t"))
    assert proc.returncode == 2 and "already holds polar-swe__pagekit-1; pass --force" in proc.stderr
    assert polar_tasks("from-swebench", str(src), "--out", str(tmp_path / "t"), "--force").returncode == 0
    assert not stale.exists()


def test_missing_file_and_bad_flags(tmp_path):
    proc = polar_tasks("from-swebench", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "t"))
    assert proc.returncode == 2 and "cannot read it" in proc.stderr and proc.stderr.count("\n") == 1
    proc = polar_tasks("from-swebench", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "t"), "--cpuz", "2")
    assert proc.returncode == 2 and "did you mean --cpus?" in proc.stderr
