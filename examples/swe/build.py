"""Writes what every SWE task in examples/swe derives from its sources, or checks it (`--check`, what the tests run).

    python examples/swe/build.py [--check] [TASK...]

A task's sources are environment/repo/ (the package at its base commit), instruction.md, task.toml and, in
tests/config.json, `patch`, `test_patch`, `FAIL_TO_PASS` and `PASS_TO_PASS`. This script derives the rest:

- config.json's `instance_id` (polar-swe__TASK-1), `repo` (polar-swe/TASK) and `base_commit`: the commit the image
  makes of environment/repo (the same names, dates and message as environment/Dockerfile's RUN), so its hash is
  known before any image is built;
- tests/base.bundle, a git bundle of that commit: the pristine repository grade.py resets files from;
- the copies of the shared files: environment/Dockerfile and .dockerignore (from examples/swe/environment/) and
  tests/grade.py (polar.rollout.swe_grade, rollout/swe_grade.py);
- tests/test.sh and solution/solve.sh (applying `patch` in /testbed) as `polar-tasks from-swebench` writes them
  (polar.rollout.swebench), so the example tasks and the converted ones grade alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from polar.rollout import swe_grade, swebench

HERE = Path(__file__).resolve().parent
SHARED = {"environment/Dockerfile": HERE / "environment" / "Dockerfile",
          "environment/.dockerignore": HERE / "environment" / ".dockerignore",
          "tests/grade.py": Path(swe_grade.__file__)}
IGNORED = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc")
# environment/Dockerfile's commit, field for field
IDENTITY = {"GIT_AUTHOR_NAME": "Polar SWE", "GIT_AUTHOR_EMAIL": "swe@polar.invalid",
            "GIT_AUTHOR_DATE": "2026-01-05T12:00:00+00:00", "GIT_COMMITTER_NAME": "Polar SWE",
            "GIT_COMMITTER_EMAIL": "swe@polar.invalid", "GIT_COMMITTER_DATE": "2026-01-05T12:00:00+00:00"}
MESSAGE = "Base commit"
RECORD_KEYS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")


def tasks(only: list[str]) -> list[Path]:
    found = sorted(p.parent for p in HERE.glob("*/task.toml"))
    if only:
        names = {p.name: p for p in found}
        unknown = [t for t in only if t not in names]
        if unknown:
            sys.exit(f"build.py: no task {', '.join(unknown)} in {HERE}; pass one of {', '.join(names)}")
        found = [names[t] for t in only]
    return found


def base_commit(repo: Path, scratch: Path, bundle: Path | None = None) -> str:
    """The base commit of `repo`'s files (and, with `bundle`, a bundle of it written there)."""
    work = scratch / "repo"
    shutil.copytree(repo, work, ignore=IGNORED)
    env = {"PATH": os.environ["PATH"], "HOME": str(scratch), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C", **IDENTITY}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=work, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    git("add", "-A")
    git("-c", "commit.gpgsign=false", "commit", "-q", "-m", MESSAGE)
    if bundle is not None:
        git("bundle", "create", "-q", str(bundle), "HEAD", "main")
    return git("rev-parse", "HEAD")


def bundle_head(bundle: Path) -> str | None:
    if not bundle.is_file():
        return None
    out = subprocess.run(["git", "bundle", "list-heads", str(bundle)], capture_output=True, text=True).stdout
    heads = dict(reversed(line.split(maxsplit=1)) for line in out.splitlines() if line.strip())
    return heads.get("HEAD") if heads.get("HEAD") == heads.get("refs/heads/main") else None


def derive(task: Path, check: bool) -> list[str]:
    """The task's derived files brought up to date (or, with `check`, what is out of date)."""
    stale: list[str] = []
    config_path = task / "tests" / "config.json"
    config = json.loads(config_path.read_text())
    with tempfile.TemporaryDirectory() as scratch:
        commit = base_commit(task / "environment" / "repo", Path(scratch))
    want = {"instance_id": f"polar-swe__{task.name}-1", "repo": f"polar-swe/{task.name}", "base_commit": commit}
    record = {k: want.get(k, config.get(k)) for k in RECORD_KEYS}
    record.update({k: v for k, v in config.items() if k not in record})
    files = {"tests/config.json": json.dumps(record, indent=2, ensure_ascii=False) + "\n",
             "tests/test.sh": swebench.TEST_SH, "solution/solve.sh": swebench.solve_script(record["patch"])}
    files.update({rel: src.read_text() for rel, src in SHARED.items()})
    for rel, text in files.items():
        path = task / rel
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(rel)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if rel.endswith(".sh"):
                path.chmod(0o755)
    bundle = task / "tests" / "base.bundle"
    if bundle_head(bundle) != commit:
        stale.append("tests/base.bundle")
        if not check:
            with tempfile.TemporaryDirectory() as scratch:
                base_commit(task / "environment" / "repo", Path(scratch), bundle)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each out-of-date file")
    parser.add_argument("task", nargs="*")
    args = parser.parse_args(argv)
    bad = []
    for task in tasks(args.task):
        bad += [f"{task.name}/{rel}" for rel in derive(task, args.check)]
    if args.check and bad:
        print(f"build.py: out of date: {', '.join(bad)}; run python examples/swe/build.py", file=sys.stderr)
        return 1
    for rel in bad:
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
