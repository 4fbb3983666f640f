"""Grades an SWE task the way SWE-bench does, from files the agent could not change.

    python3 /tests/grade.py [--testbed /testbed] [--tests /tests] [--out /logs/verifier]

Every SWE task carries a copy of this file in its tests/ (Harbor tasks are self-contained): examples/swe/build.py
copies it into the example tasks, `polar-tasks from-swebench` into the tasks it writes. Standard library, git and the
image's pytest only: it runs inside the task's image, as the verifier.

1. The pristine repository is base_commit (tests/config.json) read from tests/base.bundle when the task has one,
   else from the testbed's .git objects — through a private bare repository with no system or global config that
   borrows only those objects, every object on the way checked against its hash (a commit id names its content), so
   neither the agent's HEAD, branches, refs, config, hooks and attributes nor an object it rewrote can change what is
   restored; an fsmonitor or a hook it wrote never runs. A commit of the fix (on any branch) grades like the
   uncommitted fix.
2. Reset to base_commit's content (or removed when base_commit has no such file): every file test_patch touches,
   every file that holds an F2P or P2P test, every test file the agent added (test_*.py, *_test.py, anything under
   a tests/, test/ or testing/ directory), and every pytest configuration or plugin anywhere in the tree
   (conftest.py, pytest.ini, .pytest.ini, tox.ini, setup.cfg, pyproject.toml). A symlink on the way to one of them
   is replaced by a directory first.
3. test_patch is applied (a patch that does not apply is a grading error, never a reward).
4. Exactly the F2P and P2P tests run: `python -I -B -m pytest -p no:cacheprovider -rA ID...` in the testbed, with
   the task's own configuration; -I keeps the testbed off sys.path until pytest's own `pythonpath` puts it there, so a
   pytest.py the agent wrote is not the pytest that runs. A named test that pytest cannot find counts as not
   collected and the rest run again without it.
5. Statuses are read as SWE-bench's pytest log parser reads them, from the last short test summary: PASSED and
   XFAIL pass; FAILED, ERROR, SKIPPED, XPASS and a test with no line (not collected) fail; a test with a
   passing and a failing line (a teardown error) fails.
6. /logs/verifier: any reward file found there is removed first; then reward.txt (1 iff every F2P and P2P test
   passes, else 0) and reward.json: `reward` (the same), `graded` (the share of F2P tests passing; 0 when a P2P test
   broke), `resolved`, `f2p_passed`, `f2p_total`, `p2p_passed`, `p2p_total`, and `tests` (each test's status);
   pytest's output is pytest.log. A grading error (base_commit's objects missing or altered, a test patch that does
   not apply, pytest missing) exits 2 with one line on stderr and writes no reward, so the runner records
   verifier_error rather than a 0.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

PASS = ("PASSED", "XFAIL")
STATUSES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
NOT_COLLECTED = "NOT_COLLECTED"
CONFIG_NAMES = {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}
TEST_DIRS = {"tests", "test", "testing"}
TEST_FILE = re.compile(r"(?:test_.*|.*_test)\.py")
SUMMARY = re.compile(r"^=+ short test summary info =+$")
RULE = re.compile(r"^=+ .* =+$")
NOT_FOUND = re.compile(r"^ERROR: (?:not found:|found no collectors for) (.+?)\s*$")  # pytest 8, 9
PATCH_PATH = re.compile(r"^(?:---|\+\+\+) (.+)$")


class GradingError(Exception):
    """The grading itself failed: no reward is written."""


def git_env(home: Path) -> dict[str, str]:
    """git with nothing from the system, the user or the agent: no system or global config, a private HOME."""
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": str(home), "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0"}


class Base:
    """base_commit's files, read from a private bare repository whose objects come from tests/base.bundle, else
    from the testbed's .git (as an alternate object store, nothing else of it). Every object on the way — the
    commit, its trees, each blob restored — is checked against its hash, so a rewritten or forged object in an
    agent-writable store is a grading error, never a restored file."""

    def __init__(self, tests: Path, testbed: Path, commit: str, scratch: Path) -> None:
        self.env, self.git_dir, self.commit = git_env(scratch), scratch / "base.git", commit
        bundle = tests / "base.bundle"
        if bundle.is_file():
            self.source = str(bundle)
            self._git("clone", "--bare", "--quiet", str(bundle), str(self.git_dir), git_dir=False)
        else:
            self.source = str(testbed / ".git")
            self._git("init", "--quiet", "--bare", str(self.git_dir), git_dir=False)
            self.env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(testbed / ".git" / "objects")
        self.env["GIT_NO_REPLACE_OBJECTS"] = "1"
        kind, body = self._object(commit, missing=f"base_commit {commit} is not in {self.source}")
        if kind != b"commit" or not body.startswith(b"tree "):
            raise GradingError(f"base_commit {commit} in {self.source} is a {kind.decode()}, not a commit")
        self.files: dict[str, tuple[str, str]] = {}  # path -> (mode, blob)
        self._walk(body[5:body.index(b"\n")].decode(), "")

    def _git(self, *args: str, git_dir: bool = True, check: bool = True, stdin: bytes | None = None,
             cwd: Path | None = None) -> subprocess.CompletedProcess:
        cmd = ["git", *(["--git-dir", str(self.git_dir)] if git_dir else []), *args]
        try:
            proc = subprocess.run(cmd, input=stdin, capture_output=True, env=self.env, cwd=cwd)
        except FileNotFoundError:
            raise GradingError("git is not installed in the image") from None
        if check and proc.returncode != 0:
            raise GradingError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()[-300:]}")
        return proc

    def _object(self, oid: str, missing: str = "") -> tuple[bytes, bytes]:
        """(type, content) of object `oid`, its hash checked."""
        kind = self._git("cat-file", "-t", oid, check=False)
        if kind.returncode != 0:
            raise GradingError(missing or f"object {oid} of base_commit is not in {self.source}")
        kind_name = kind.stdout.strip()
        body = self._git("cat-file", kind_name.decode(), oid).stdout
        digest = (hashlib.sha1 if len(oid) == 40 else hashlib.sha256)(
            kind_name + b" " + str(len(body)).encode() + b"\0" + body).hexdigest()
        if digest != oid:
            raise GradingError(f"object {oid} in {self.source} does not hash to its name: the store was tampered with")
        return kind_name, body

    def _walk(self, tree: str, prefix: str) -> None:
        kind, body = self._object(tree)
        width = 20 if len(tree) == 40 else 32
        pos = 0
        while pos < len(body):
            space, nul = body.index(b" ", pos), body.index(b"\0", pos)
            mode, name = body[pos:space].decode(), body[space + 1:nul].decode("utf-8", "surrogateescape")
            oid = body[nul + 1:nul + 1 + width].hex()
            pos = nul + 1 + width
            if mode == "40000":
                self._walk(oid, f"{prefix}{name}/")
            elif mode != "160000":  # a submodule's commit is not a file
                self.files[prefix + name] = (mode, oid)

    def blob(self, path: str) -> bytes:
        kind, body = self._object(self.files[path][1])
        return body

    def apply(self, patch: str, testbed: Path) -> None:
        proc = self._git("--work-tree", str(testbed), "apply", "--whitespace=nowarn", "-", stdin=patch.encode(),
                         check=False, cwd=testbed)
        if proc.returncode != 0:
            raise GradingError(f"test_patch does not apply: {proc.stderr.decode(errors='replace').strip()[-300:]}")


def patch_paths(patch: str) -> set[str]:
    """Every path a unified diff names on its ---/+++ lines (both sides of a rename), /dev/null left out."""
    paths = set()
    for line in patch.splitlines():
        match = PATCH_PATH.match(line)
        if not match:
            continue
        name = match.group(1).split("\t")[0]
        if name.startswith('"') and name.endswith('"'):  # git quotes unusual names C-style
            name = codecs.escape_decode(name[1:-1].encode())[0].decode("utf-8", "surrogateescape")
        if name != "/dev/null" and name[:2] in ("a/", "b/"):
            paths.add(name[2:])
    return paths


def tree_files(testbed: Path) -> set[str]:
    """Every file and symlink under the testbed, relative, the top-level .git left out; symlinks not followed."""
    found = set()
    for top, dirs, files in os.walk(testbed):
        rel = Path(top).relative_to(testbed)
        if rel == Path("."):
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in files + [d for d in dirs if (Path(top) / d).is_symlink()]:
            found.add((rel / name).as_posix())
    return found


def is_test_file(path: str) -> bool:
    parts = path.split("/")
    return bool(TEST_FILE.fullmatch(parts[-1])) or any(p in TEST_DIRS for p in parts[:-1])


def to_reset(config: dict, base: Base, present: set[str]) -> set[str]:
    """Rule 2's paths."""
    paths = patch_paths(config["test_patch"])
    paths |= {test.split("::")[0] for test in config["FAIL_TO_PASS"] + config["PASS_TO_PASS"]}
    paths |= {p for p in present if p not in base.files and is_test_file(p)}
    paths |= {p for p in present | set(base.files) if p.split("/")[-1] in CONFIG_NAMES}
    return paths


def _clear_way(testbed: Path, rel: str) -> Path:
    """The target path with every directory above it a real directory (a symlink or file there is removed)."""
    node = testbed
    for part in Path(rel).parts[:-1]:
        node = node / part
        if node.is_symlink() or (node.exists() and not node.is_dir()):
            node.unlink()
        node.mkdir(exist_ok=True)
    return testbed / rel


def reset(testbed: Path, base: Base, paths: set[str]) -> None:
    for rel in sorted(paths):
        target = _clear_way(testbed, rel)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if rel not in base.files:
            continue
        mode, content = base.files[rel][0], base.blob(rel)
        if mode == "120000":
            os.symlink(content.decode("utf-8", "surrogateescape"), target)
        else:
            target.write_bytes(content)
            target.chmod(0o755 if mode == "100755" else 0o644)
            target.chmod(target.stat().st_mode | stat.S_IRUSR | stat.S_IWUSR)


def run_pytest(testbed: Path, ids: list[str], home: Path) -> tuple[str, set[str]]:
    """pytest on exactly `ids`; (its output, the ids it could not find)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    env["HOME"] = str(home)
    missing: set[str] = set()
    logs = []
    while True:
        wanted = [i for i in ids if i not in missing]
        if not wanted:
            return "\n".join(logs), missing
        cmd = [sys.executable, "-I", "-B", "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--tb=short", *wanted]
        proc = subprocess.run(cmd, cwd=testbed, env=env, capture_output=True, text=True, errors="replace")
        out = proc.stdout + proc.stderr
        logs.append(f"$ {' '.join(cmd)}\n{out}")
        if proc.returncode != 4:  # 4: usage error, which is how pytest says a named test is not there
            return "\n".join(logs), missing
        gone = set()
        for line in out.splitlines():
            match = NOT_FOUND.match(line)
            if match:
                named = os.path.relpath(match.group(1), testbed) if match.group(1).startswith("/") else match.group(1)
                # pytest names the test, its parametrized form's function, or its module
                gone |= {i for i in wanted if i == named or i.startswith((named + "[", named + "::"))}
        if not gone:
            raise GradingError(f"pytest refused the run (exit 4): {out.strip()[-300:]}")
        missing |= gone


def statuses(log: str, ids: list[str]) -> dict[str, str]:
    """Rule 5: each id's status from the last short test summary of each pytest run in `log`."""
    found: dict[str, list[str]] = {i: [] for i in ids}
    for run in log.split("\n$ "):
        lines = run.splitlines()
        starts = [n for n, line in enumerate(lines) if SUMMARY.match(line)]
        if not starts:
            continue
        for line in lines[starts[-1] + 1:]:
            if RULE.match(line):
                break
            status, _, rest = line.partition(" ")
            if status not in STATUSES:
                continue
            for test in ids:
                if rest == test or rest.startswith(test + " - "):
                    found[test].append(status)
    result = {}
    for test, seen in found.items():
        if not seen:
            result[test] = NOT_COLLECTED
        else:
            failing = [s for s in seen if s not in PASS]
            result[test] = failing[-1] if failing else seen[-1]
    return result


def grade(testbed: Path, tests: Path, out: Path) -> dict:
    try:
        config = json.loads((tests / "config.json").read_text(encoding="utf-8"))
        f2p, p2p = list(config["FAIL_TO_PASS"]), list(config["PASS_TO_PASS"])
        commit, test_patch = config["base_commit"], config["test_patch"]
    except (OSError, ValueError, KeyError) as exc:
        raise GradingError(f"{tests / 'config.json'} is not a task record ({exc})") from None
    if not f2p:
        raise GradingError("config.json names no FAIL_TO_PASS test")
    with tempfile.TemporaryDirectory(prefix="grade-") as scratch:
        base = Base(tests, testbed, commit, Path(scratch))
        reset(testbed, base, to_reset(config, base, tree_files(testbed)))
        base.apply(test_patch, testbed)
        log, missing = run_pytest(testbed, f2p + p2p, Path(scratch))
    (out / "pytest.log").write_text(log, encoding="utf-8")
    if "No module named pytest" in log:
        raise GradingError("pytest is not installed in the image")
    status = statuses(log, f2p + p2p)
    for test in missing:
        status[test] = NOT_COLLECTED
    f2p_passed = sum(status[t] in PASS for t in f2p)
    p2p_passed = sum(status[t] in PASS for t in p2p)
    resolved = f2p_passed == len(f2p) and p2p_passed == len(p2p)
    return {"reward": 1.0 if resolved else 0.0,
            "graded": f2p_passed / len(f2p) if p2p_passed == len(p2p) else 0.0,
            "resolved": resolved, "f2p_passed": f2p_passed, "f2p_total": len(f2p), "p2p_passed": p2p_passed,
            "p2p_total": len(p2p), "tests": status}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade an SWE task as SWE-bench does.")
    parser.add_argument("--testbed", type=Path, default=Path("/testbed"))
    parser.add_argument("--tests", type=Path, default=Path("/tests"))
    parser.add_argument("--out", type=Path, default=Path("/logs/verifier"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("reward.txt", "reward.json"):  # whatever was there is not this grading's
        (args.out / name).unlink(missing_ok=True)
    try:
        result = grade(args.testbed.resolve(), args.tests.resolve(), args.out)
    except GradingError as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    (args.out / "reward.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (args.out / "reward.txt").write_text(f"{int(result['reward'])}\n", encoding="utf-8")
    failed = sorted(t for t, s in result["tests"].items() if s not in PASS)
    print(f"reward {int(result['reward'])}: F2P {result['f2p_passed']}/{result['f2p_total']}, "
          f"P2P {result['p2p_passed']}/{result['p2p_total']}" + (f"; failing: {', '.join(failed)}" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
