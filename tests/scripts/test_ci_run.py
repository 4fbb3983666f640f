""".ci/run, what CI runs (issue 42), on a copy of the tree whose scripts/setup and venv pythons only print what they
were given: CI=true when the CI leaves it unset (a CI's own value is kept), and both pytest sessions (.venv and
.venv-train) get `--durations=30`, so each prints its 30 slowest tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.gateway import ROOT

pytestmark = pytest.mark.unit

ECHO = '#!/usr/bin/env bash\necho "$0 CI=${CI-unset} $*"\n'


@pytest.fixture
def tree(tmp_path):
    for rel in (".ci/run", "scripts/test"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(ROOT) / rel, tmp_path / rel)
    for rel in ("scripts/setup", ".venv/bin/python", ".venv-train/bin/python"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(ECHO)
        (tmp_path / rel).chmod(0o755)
    return tmp_path


def _run(tree: Path, **env) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "CI"}
    proc = subprocess.run([str(tree / ".ci" / "run")], env={**base, **env}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_1_ci_is_true_when_unset_and_both_sessions_print_their_30_slowest(tree):
    lines = _run(tree)
    sessions = [line for line in lines if "/bin/python " in line]
    assert [line.split()[0] for line in sessions] == [".venv/bin/python", ".venv-train/bin/python"], lines
    assert all(" CI=true -m pytest " in line and "--durations=30" in line.split() for line in sessions), lines


def test_2_a_ci_that_sets_ci_keeps_its_value(tree):
    assert all(" CI=yes " in line for line in _run(tree, CI="yes")), "CI's own value is kept"
