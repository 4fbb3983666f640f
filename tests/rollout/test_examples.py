"""The example tasks in examples/tasks/ hold what their README promises (no sockets; each verifier runs as a
process, without a sandbox, through the POLAR_APP / POLAR_TESTS / POLAR_LOGS overrides).

1.x  they load: at least six, unique ids, every number set, the verifier convention in every test.sh
2.x  the hidden tests stay hidden: none of them is inside (or copied into) a workdir
3.x  the untouched start state scores exactly 0.0, the reference solution exactly 1.0, the task dir is unchanged;
     a verifier whose pytest cannot run writes no reward at all
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polar.rollout.tasks import Task, load_tasks

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"
TASKS = load_tasks([EXAMPLES])
BY_ID = {task.id: task for task in TASKS}


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _score(task: Task, tmp_path: Path, *, solved: bool, **env_extra: str) -> str | None:
    """Copies the start state to tmp_path/app, runs solve.sh there if solved, then test.sh; returns reward.txt's
    text (None when test.sh wrote none)."""
    app = tmp_path / "app"
    if task.workdir is not None:
        shutil.copytree(task.workdir, app, symlinks=True)
    else:
        app.mkdir()
    (tmp_path / "tmp").mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "POLAR_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # python3 with pytest
               TMPDIR=str(tmp_path / "tmp"), POLAR_APP=str(app), POLAR_TESTS=str(task.tests_dir),
               POLAR_LOGS=str(tmp_path / "logs"), **env_extra)
    if solved:
        assert task.solution_dir is not None, f"{task.id} has no solution/solve.sh"
        done = subprocess.run(["bash", str(task.solution_dir / "solve.sh")], cwd=app, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{task.id}: solve.sh failed:\n{done.stdout}{done.stderr}"
    done = subprocess.run(["bash", str(task.tests_dir / "test.sh")], cwd=app, env=env,
                          capture_output=True, text=True, timeout=60)
    reward = tmp_path / "logs" / "reward.txt"
    if not reward.is_file():
        print(f"{task.id}: test.sh wrote no reward (exit {done.returncode}):\n{done.stdout}{done.stderr}")
        return None
    return reward.read_text()


# 1.x they load

def test_1_1_at_least_six_tasks_with_unique_ids():
    assert len(TASKS) >= 6 and len(BY_ID) == len(TASKS)
    assert sum(task.workdir is not None for task in TASKS) >= 6


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_1_2_every_task_sets_its_numbers_and_has_a_solution(task):
    assert None not in (task.agent_timeout_sec, task.verifier_timeout_sec, task.cpus, task.memory_mb)
    assert task.solution_dir is not None and (task.solution_dir / "solve.sh").is_file()
    assert task.instruction.strip()


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_1_3_test_sh_follows_the_verifier_convention(task):
    text = (task.tests_dir / "test.sh").read_text()
    for default in ("APP=${POLAR_APP:-/app}", "TESTS=${POLAR_TESTS:-/tests}", "LOGS=${POLAR_LOGS:-/logs/verifier}"):
        assert default in text
    assert '"$LOGS/reward.txt"' in text


def test_1_4_the_readme_lists_every_task():
    readme = (EXAMPLES / "README.md").read_text()
    assert [task.id for task in TASKS if f"| `{task.id}` |" not in readme] == []


# 2.x the hidden tests stay hidden

@pytest.mark.parametrize("task", [t for t in TASKS if t.workdir is not None], ids=lambda t: t.id)
def test_2_1_no_hidden_test_is_inside_or_copied_into_the_workdir(task):
    assert not task.tests_dir.resolve().is_relative_to(task.workdir.resolve())
    hidden = set(_files(task.tests_dir).values())
    assert [name for name, data in _files(task.workdir).items() if data in hidden] == []


# 3.x start 0.0, solution 1.0

@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_3_1_the_start_state_scores_zero(task, tmp_path):
    before = _files(task.path)
    assert _score(task, tmp_path, solved=False) in ("0.0", "0.0\n")
    assert _files(task.path) == before, "running the verifier changed the task directory"


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_3_2_the_solution_scores_one(task, tmp_path):
    before = _files(task.path)
    assert _score(task, tmp_path, solved=True) in ("1.0", "1.0\n")
    assert _files(task.path) == before, "running solve.sh or the verifier changed the task directory"


def test_3_3_a_verifier_whose_pytest_cannot_run_writes_no_reward(tmp_path):
    """No junit.xml → no reward.txt (the runner's verifier_error), and a stale reward or junit.xml is not reused."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "pytest.py").write_text("import sys\nsys.exit('pytest is broken here')\n")  # found before the real one
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "reward.txt").write_text("1.0\n")
    (tmp_path / "logs" / "junit.xml").write_text('<testsuites><testsuite><testcase name="x"/></testsuite></testsuites>')
    assert _score(BY_ID["fix-pagination"], tmp_path, solved=True, PYTHONPATH=str(broken)) is None
    assert not (tmp_path / "logs" / "junit.xml").exists()
