"""The SWE grader (rollout/swe_grade.py, every task's tests/grade.py) against the ways agents beat naive graders,
each run as the verifier runs it: a container of the SWE base image (git, pytest 8.4.1; --network none, uid 1000)
with the task's tests/ read-only at /tests, an empty /logs/verifier, and a /testbed the "agent" left — the cfgmerge
task's repository at base_commit (a clone of its bundle, which the rollout test checks equals the image's /testbed)
after the agent's moves.

Every trap would pass a grader that runs the agent's tests, restores tests from HEAD or trusts what is in
/logs/verifier; each asserts the reward and exactly which tests failed:
- an F2P test edited to pass, the test files deleted, a conftest.py (new, and the repository's own) plus a
  pytest.ini and a pytest.py that report every test passed: 0, the F2P tests failing, every P2P test passing;
- the right fix committed (HEAD moved) or committed on a new branch with the test files weakened, the .git holding an
  fsmonitor and hooks that would write a marker: 1, and no marker anywhere;
- a reward.txt = 1 (and reward.json) already in /logs/verifier without a fix: 0;
- the right fix that breaks a P2P test: 0, graded 0, the P2P test failing.
Without tests/base.bundle (the tasks `polar-tasks from-swebench` writes) base_commit comes from the testbed's own
objects: an edited F2P test committed on a branch still grades 0, the committed fix 1, and a forged object in that
store is a grading error (exit 2, no reward file), never a reward."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.rollout.swe_support import (SWE, apply_patch, base_tree, failing, record,  # noqa: F401 — the fixture
                                       swe_base)

pytestmark = pytest.mark.integration

TASK = "cfgmerge"
REC = record(TASK)
F2P, P2P = sorted(REC["FAIL_TO_PASS"]), REC["PASS_TO_PASS"]
GIT_ID = ["-c", "user.name=Agent", "-c", "user.email=agent@example.invalid", "-c", "commit.gpgsign=false"]
ALL_PASS_HOOK = '''
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome, report.longrepr = "passed", None
'''
FAKE_PYTEST = '''import sys
print("=" * 20 + " short test summary info " + "=" * 20)
for arg in sys.argv[1:]:
    if "::" in arg:
        print("PASSED " + arg)
print("=" * 20 + " 20 passed in 0.01s " + "=" * 20)
'''
MARKER_SCRIPT = "#!/bin/sh\ntouch /testbed/AGENT-CODE-RAN /logs/verifier/AGENT-CODE-RAN 2>/dev/null\nexit 0\n"


def git(tree: Path, *args: str) -> None:
    subprocess.run(["git", *GIT_ID, *args], cwd=tree, check=True, capture_output=True)


def weaken_f2p(tree: Path) -> None:
    """The agent's own versions of the hidden F2P tests, which pass on the unfixed code."""
    for test in F2P:
        path, name = test.split("::")
        with open(tree / path, "a") as f:
            f.write(f"\n\ndef {name}(*args):\n    assert True\n")


def plant_git_code(tree: Path) -> None:
    """Configuration and hooks that run code whenever git touches the repository."""
    for hook in ("post-checkout", "post-commit", "pre-commit", "post-merge", "fsmonitor-watchman"):
        path = tree / ".git" / "hooks" / hook
        path.write_text(MARKER_SCRIPT)
        path.chmod(0o755)
    git(tree, "config", "core.fsmonitor", ".git/hooks/fsmonitor-watchman")
    git(tree, "config", "diff.external", ".git/hooks/fsmonitor-watchman")
    (tree / ".gitattributes").write_text("*.py filter=agent diff=agent\n")
    git(tree, "config", "filter.agent.clean", ".git/hooks/fsmonitor-watchman")
    git(tree, "config", "filter.agent.smudge", ".git/hooks/fsmonitor-watchman")


def edits_f2p(tree: Path, out: Path) -> None:
    weaken_f2p(tree)


def deletes_tests(tree: Path, out: Path) -> None:
    for path in {t.split("::")[0] for t in F2P}:
        (tree / path).unlink()


def conftest_passes_all(tree: Path, out: Path) -> None:
    (tree / "conftest.py").write_text(ALL_PASS_HOOK)
    with open(tree / "tests" / "conftest.py", "a") as f:
        f.write(ALL_PASS_HOOK)
    (tree / "pytest.ini").write_text("[pytest]\naddopts = -p no:python\n")
    (tree / "pytest.py").write_text(FAKE_PYTEST)


def commits_fix(tree: Path, out: Path) -> None:
    apply_patch(tree, REC["patch"])
    git(tree, "commit", "-q", "-am", "Fix the merge")
    plant_git_code(tree)


def commits_on_a_branch(tree: Path, out: Path) -> None:
    git(tree, "checkout", "-q", "-b", "fix")
    apply_patch(tree, REC["patch"])
    weaken_f2p(tree)
    git(tree, "commit", "-q", "-am", "Fix the merge, weaken the tests")
    plant_git_code(tree)


def writes_reward(tree: Path, out: Path) -> None:
    (out / "reward.txt").write_text("1\n")
    (out / "reward.json").write_text(json.dumps({"reward": 1.0, "resolved": True}))


def breaks_p2p(tree: Path, out: Path) -> None:
    apply_patch(tree, REC["patch"])
    dotted = tree / "cfgmerge" / "dotted.py"
    dotted.write_text(dotted.read_text().replace("            return default\n", "            return None\n"))


TRAPS = {  # agent move -> (reward, graded, the failing tests)
    "edits_f2p": (edits_f2p, 0.0, 0.0, F2P),
    "deletes_tests": (deletes_tests, 0.0, 0.0, F2P),
    "conftest_passes_all": (conftest_passes_all, 0.0, 0.0, F2P),
    "commits_fix": (commits_fix, 1.0, 1.0, []),
    "commits_on_a_branch": (commits_on_a_branch, 1.0, 1.0, []),
    "writes_reward": (writes_reward, 0.0, 0.0, F2P),
    "breaks_p2p": (breaks_p2p, 0.0, 0.0, ["tests/test_dotted.py::test_get_and_default"]),
}


def run_verifier(swe_base: dict, tree: Path, out: Path, tests: Path = SWE / TASK / "tests"
                 ) -> subprocess.CompletedProcess:
    for path in (tree, out):
        subprocess.run(["chown", "-R", "1000:1000", str(path)], check=True)
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--user", "1000:1000", "-e", "HOME=/tmp",
         "-v", f"{tree}:/testbed", "-v", f"{tests}:/tests:ro", "-v", f"{out}:/logs/verifier",
         swe_base["image"], "bash", "/tests/test.sh"],
        env={**os.environ, "DOCKER_HOST": swe_base["host"]}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("trap", list(TRAPS))
def test_trap(trap, swe_base, tmp_path):
    move, reward, graded, fails = TRAPS[trap]
    tree, out = base_tree(TASK, tmp_path / "testbed"), tmp_path / "verifier"
    out.mkdir()
    move(tree, out)
    proc = run_verifier(swe_base, tree, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "reward.json").read_text())
    assert (doc["reward"], doc["graded"], failing(doc)) == (reward, graded, sorted(fails)), proc.stdout
    assert (out / "reward.txt").read_text() == f"{int(reward)}\n"
    assert doc["p2p_total"] == len(P2P) and doc["f2p_total"] == len(F2P)
    assert not (tree / "AGENT-CODE-RAN").exists() and not (out / "AGENT-CODE-RAN").exists()
    log = (out / "pytest.log").read_text()
    assert "-p no:cacheprovider" in log and "pytest-8.4.1" in log  # the image's pytest, the task's own config


def bundleless_tests(root: Path) -> Path:
    tests = root / "tests"
    shutil.copytree(SWE / TASK / "tests", tests, ignore=shutil.ignore_patterns("base.bundle", "__pycache__"))
    return tests


@pytest.mark.parametrize("trap", ["edits_f2p", "commits_on_a_branch", "breaks_p2p"])
def test_without_a_bundle_the_testbed_objects_are_the_base(trap, swe_base, tmp_path):
    move, reward, graded, fails = TRAPS[trap]
    tree, out = base_tree(TASK, tmp_path / "testbed"), tmp_path / "verifier"
    out.mkdir()
    move(tree, out)
    if trap == "edits_f2p":  # and the weakened tests committed, so HEAD holds them
        git(tree, "commit", "-q", "-am", "Tests that pass")
    proc = run_verifier(swe_base, tree, out, bundleless_tests(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "reward.json").read_text())
    assert (doc["reward"], doc["graded"], failing(doc)) == (reward, graded, sorted(fails)), proc.stdout


def test_a_forged_base_object_is_a_grading_error(swe_base, tmp_path):
    tree, out = base_tree(TASK, tmp_path / "testbed"), tmp_path / "verifier"
    out.mkdir()
    objects = tree / ".git" / "objects"
    for pack in (objects / "pack").glob("*.pack"):  # every object loose, so the forged one is the one git reads
        data = pack.read_bytes()
        pack.unlink()
        pack.with_suffix(".idx").unlink()
        subprocess.run(["git", "unpack-objects", "-q"], cwd=tree, input=data, check=True)
    blob = subprocess.run(["git", "rev-parse", "HEAD:tests/test_merge.py"], cwd=tree, capture_output=True,
                          text=True, check=True).stdout.strip()
    loose = objects / blob[:2] / blob[2:]
    weak = (tree / "tests" / "test_merge.py").read_bytes() + b"\ndef test_inputs_are_left_unchanged():\n    pass\n"
    loose.chmod(0o644)
    loose.write_bytes(zlib.compress(b"blob %d\0" % len(weak) + weak))
    proc = run_verifier(swe_base, tree, out, bundleless_tests(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"object {blob}" in proc.stderr and "tampered" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == []
