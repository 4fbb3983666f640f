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
MOUNT = "/traps"  # where the cases are in the container (no such directory on the host)
MARKER_SCRIPT = f"#!/bin/sh\ntouch {MOUNT}/markers/AGENT-CODE-RAN 2>/dev/null\nexit 0\n"


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


def forge_base_object(tree: Path, out: Path) -> None:
    """The testbed's objects all loose (so git reads the forged one), base_commit's tests/test_merge.py rewritten in
    place with a weakened F2P test: the content no longer hashes to the object's name."""
    objects = tree / ".git" / "objects"
    for pack in (objects / "pack").glob("*.pack"):
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
    (out.parent / "forged").write_text(blob)


def commits_weakened_tests(tree: Path, out: Path) -> None:
    edits_f2p(tree, out)
    git(tree, "commit", "-q", "-am", "Tests that pass")  # HEAD holds them


# case -> (the agent's move, whether tests/ holds the bundle)
CASES = {**{trap: (move, True) for trap, (move, *_) in TRAPS.items()},
         "no-bundle:edits_f2p": (commits_weakened_tests, False),
         "no-bundle:commits_on_a_branch": (commits_on_a_branch, False),
         "no-bundle:breaks_p2p": (breaks_p2p, False),
         "no-bundle:forged_object": (forge_base_object, False)}
# every case graded in one container: `bash TESTS/test.sh --testbed … --tests TESTS --out …`, as the verifier runs it
GRADE_ALL = f"""for case in {MOUNT}/cases/*/; do
    case=${{case%/}}
    tests={MOUNT}/tests; [ -f "$case/no-bundle" ] && tests={MOUNT}/tests-no-bundle
    bash "$tests/test.sh" --testbed "$case/testbed" --tests "$tests" --out "$case/verifier" \
        >"$case/stdout" 2>"$case/stderr"
    echo $? >"$case/rc"
done"""


@pytest.fixture(scope="module")
def verdicts(swe_base, tmp_path_factory) -> dict[str, dict]:
    """Every case's testbed prepared on the host, then graded in one container of the SWE base (--network none,
    uid 1000, the tests read-only): {case: rc, stdout, stderr, reward (reward.json or None), files (in
    /logs/verifier), root}."""
    root = tmp_path_factory.mktemp("swe-traps")
    shutil.copytree(SWE / TASK / "tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(SWE / TASK / "tests", root / "tests-no-bundle", ignore=shutil.ignore_patterns("base.bundle",
                                                                                                  "__pycache__"))
    for n, (case, (move, bundle)) in enumerate(CASES.items()):
        where = root / "cases" / f"{n:02d}"
        (where / "verifier").mkdir(parents=True)
        (where / "case").write_text(case)
        if not bundle:
            (where / "no-bundle").write_text("")
        move(base_tree(TASK, where / "testbed"), where / "verifier")
    (root / "markers").mkdir()
    subprocess.run(["chown", "-R", "1000:1000", str(root)], check=True)
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--user", "1000:1000", "-e", "HOME=/tmp",
         "-v", f"{root / 'cases'}:{MOUNT}/cases", "-v", f"{root / 'markers'}:{MOUNT}/markers", "-v", f"{root / 'tests'}:{MOUNT}/tests:ro",
         "-v", f"{root / 'tests-no-bundle'}:{MOUNT}/tests-no-bundle:ro", swe_base["image"], "bash", "-c", GRADE_ALL],
        env={**os.environ, "DOCKER_HOST": swe_base["host"]}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = {}
    for where in sorted((root / "cases").iterdir()):
        reward = where / "verifier" / "reward.json"
        out[(where / "case").read_text()] = {
            "rc": int((where / "rc").read_text()), "stdout": (where / "stdout").read_text(),
            "stderr": (where / "stderr").read_text(), "reward": json.loads(reward.read_text()) if reward.is_file()
            else None, "files": sorted(p.name for p in (where / "verifier").iterdir()), "root": root, "dir": where}
    return out


@pytest.mark.parametrize("trap", list(TRAPS))
def test_trap(trap, verdicts):
    _, reward, graded, fails = TRAPS[trap]
    got = verdicts[trap]
    assert got["rc"] == 0, got["stdout"] + got["stderr"]
    doc = got["reward"]
    assert (doc["reward"], doc["graded"], failing(doc)) == (reward, graded, sorted(fails)), got["stdout"]
    assert (got["dir"] / "verifier" / "reward.txt").read_text() == f"{int(reward)}\n"
    assert doc["p2p_total"] == len(P2P) and doc["f2p_total"] == len(F2P)
    assert not (got["root"] / "markers" / "AGENT-CODE-RAN").exists()  # no hook, fsmonitor or filter of the agent's ran
    log = (got["dir"] / "verifier" / "pytest.log").read_text()
    assert "-p no:cacheprovider" in log and "pytest-8.4.1" in log  # the image's pytest, the task's own config


@pytest.mark.parametrize("trap", ["edits_f2p", "commits_on_a_branch", "breaks_p2p"])
def test_without_a_bundle_the_testbed_objects_are_the_base(trap, verdicts):
    _, reward, graded, fails = TRAPS[trap]
    got = verdicts[f"no-bundle:{trap}"]
    assert got["rc"] == 0, got["stdout"] + got["stderr"]
    doc = got["reward"]
    assert (doc["reward"], doc["graded"], failing(doc)) == (reward, graded, sorted(fails)), got["stdout"]


def test_a_forged_base_object_is_a_grading_error(verdicts):
    got = verdicts["no-bundle:forged_object"]
    blob = (got["dir"] / "forged").read_text()
    assert got["rc"] == 2, got["stdout"] + got["stderr"]
    assert f"object {blob}" in got["stderr"] and "tampered" in got["stderr"] and got["stderr"].count("\n") == 1
    assert got["files"] == []
