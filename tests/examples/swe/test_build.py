"""examples/swe/build.py: every task's derived files are current — base_commit is the commit of environment/repo
with the Dockerfile's fixed names and dates, base.bundle holds it, solve.sh carries the record's patch, and every
copy of the shared Dockerfile, the grader (polar.rollout.swe_grade) and test.sh (polar.rollout.swebench) equals
its source."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from polar.rollout import swebench
from tests.rollout.swe_support import ROOT, SWE, TASKS, record

pytestmark = pytest.mark.unit


def test_derived_files_are_current():
    proc = subprocess.run([sys.executable, str(SWE / "build.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_copies_equal_their_sources():
    for task in TASKS:
        for rel, src in (("tests/grade.py", ROOT / "rollout" / "swe_grade.py"),
                         ("environment/Dockerfile", SWE / "environment/Dockerfile")):
            assert (SWE / task / rel).read_bytes() == src.read_bytes(), f"{task}/{rel}"
        assert (SWE / task / "tests/test.sh").read_text() == swebench.TEST_SH


def test_check_names_a_stale_copy_and_a_moved_base(tmp_path):
    tree = tmp_path / "swe"
    shutil.copytree(SWE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "pagekit" / "tests" / "grade.py").write_text("# edited\n")
    with open(tree / "slugkit" / "environment" / "repo" / "README.md", "a") as f:
        f.write("one more line\n")
    proc = subprocess.run([sys.executable, str(tree / "build.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "pagekit/tests/grade.py" in proc.stderr
    assert "slugkit/tests/config.json" in proc.stderr and "slugkit/tests/base.bundle" in proc.stderr
    assert subprocess.run([sys.executable, str(tree / "build.py")], capture_output=True).returncode == 0
    assert record("slugkit")["base_commit"] != __import__("json").loads(
        (tree / "slugkit" / "tests" / "config.json").read_text())["base_commit"]
