"""`polar-tasks from-swebench RECORDS.jsonl --out DIR` — SWE-bench / SWE-Gym records as tasks in Harbor's layout.

    polar-tasks from-swebench RECORDS.jsonl --out DIR [--image-pattern P] [--cpus N] [--memory-mb M]
                              [--storage-mb S] [--agent-timeout S] [--verify-timeout S] [--force]

Rules. Each violation is one line on stderr naming the fix, exit 2, and nothing written.
1. RECORDS.jsonl holds one JSON object a line (blank lines skipped) with SWE-bench's keys: `instance_id` (letters,
   digits, `.`, `_`, `-`; unique in the file), `repo`, `base_commit`, `problem_statement`, `test_patch`,
   `FAIL_TO_PASS` (at least one test) and `PASS_TO_PASS`, the last two as lists or as the JSON-encoded lists the
   published datasets hold; `patch` (the gold patch) when it has one. Tests are pytest node ids (`path::name`): the
   grader runs pytest, so a repository graded by another runner (Django's, SymPy's) is refused by name.
2. Each record becomes DIR/<instance_id>/: task.toml (`[environment] docker_image` from the pattern, `cpus`,
   `memory_mb`, `storage_mb`; `[agent]`/`[verifier]` `timeout_sec`; the record's id and repository under
   `[metadata]`), instruction.md (the problem statement, as SWE-bench gives it to the model), tests/config.json (the
   record, the test lists as lists), tests/test.sh and tests/grade.py (polar.rollout.swe_grade: pristine files
   from base_commit's hash-checked objects, F2P and P2P graded as SWE-bench grades), and solution/solve.sh applying
   `patch` when the record has one.
3. The image pattern is a Python format string over `{id}` (the instance id), `{docker_id}` (SWE-bench's image name
   for it: lower case, `__` written `_1776_`) and `{repo}`; the default names SWE-bench's per-instance images,
   `swebench/sweb.eval.x86_64.{docker_id}:latest`. polar-rollout runs those images (`--pull`, `--image-map`).
4. An existing DIR/<instance_id> is refused unless --force (then its files are rewritten).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from polar.records.cliargs import OneLineParser, positive_int

DEFAULT_PATTERN = "swebench/sweb.eval.x86_64.{docker_id}:latest"
REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
GRADER = Path(__file__).with_name("swe_grade.py")

# The verifier: SWE-bench's images keep the repository's environment in a conda env named testbed (activated when the
# image has one), Harbor's adapter layout runs /tests/test.sh; grade.py does the grading (its docstring).
TEST_SH = """#!/bin/bash
# The verifier of an SWE task: the repository's test environment (SWE-bench's images keep it in a conda env named
# testbed; activated when the image has one), then grade.py beside this file grades /testbed as SWE-bench does and
# writes /logs/verifier/reward.txt and reward.json (polar.rollout.swe_grade).
if [ -f /opt/miniconda3/bin/activate ]; then
    source /opt/miniconda3/bin/activate && conda activate testbed
fi
exec python3 "$(dirname "$0")/grade.py" "$@"
"""
SOLVE_SH = """#!/bin/bash
# The reference fix: tests/config.json's `patch`, applied in /testbed.
set -euo pipefail
cd /testbed
git -c safe.directory='*' apply --whitespace=nowarn <<'POLAR_GOLD_PATCH'
{patch}POLAR_GOLD_PATCH
"""


class RecordError(Exception):
    """A record that cannot become a task; the message is one line."""


def solve_script(patch: str) -> str:
    """solution/solve.sh for a gold patch."""
    if "\nPOLAR_GOLD_PATCH\n" in f"\n{patch}":
        raise RecordError("the patch holds the line POLAR_GOLD_PATCH, which ends solve.sh's here-document")
    return SOLVE_SH.format(patch=patch if patch.endswith("\n") else patch + "\n")


def docker_id(instance_id: str) -> str:
    """SWE-bench's image name for an instance: lower case, `__` written `_1776_`."""
    return instance_id.replace("__", "_1776_").lower()


def test_list(value, key: str) -> list[str]:
    if isinstance(value, str):  # the published datasets hold the lists JSON-encoded
        try:
            value = json.loads(value)
        except ValueError:
            raise RecordError(f"{key} is a string that is not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise RecordError(f"{key} is not a list of test names")
    odd = [t for t in value if "::" not in t]
    if odd:
        raise RecordError(f"{key} names {odd[0]!r}, not a pytest node id (path::name): only repositories graded by "
                          f"pytest can be graded here")
    return value


def normalize(record, image_pattern: str) -> tuple[dict, str]:
    """(the record with its test lists as lists, the task's image)."""
    if not isinstance(record, dict):
        raise RecordError("not a JSON object")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise RecordError(f"no {', '.join(missing)} (SWE-bench's record keys: {', '.join(REQUIRED)})")
    iid = record["instance_id"]
    if not isinstance(iid, str) or not SAFE_ID.fullmatch(iid):
        raise RecordError(f"instance_id {iid!r} is not a directory name (letters, digits, '.', '_', '-')")
    for key in ("repo", "base_commit", "problem_statement", "test_patch"):
        if not isinstance(record[key], str) or not record[key].strip():
            raise RecordError(f"{key} is not a non-empty string")
    if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", record["base_commit"]):
        raise RecordError(f"base_commit {record['base_commit']!r} is not a full commit id")
    out = dict(record)
    out["FAIL_TO_PASS"] = test_list(record["FAIL_TO_PASS"], "FAIL_TO_PASS")
    out["PASS_TO_PASS"] = test_list(record["PASS_TO_PASS"], "PASS_TO_PASS")
    if not out["FAIL_TO_PASS"]:
        raise RecordError("FAIL_TO_PASS is empty: a task needs a test the fix makes pass")
    try:
        image = image_pattern.format(id=iid, docker_id=docker_id(iid), repo=record["repo"])
    except (KeyError, IndexError, ValueError) as exc:
        raise RecordError(f"--image-pattern {image_pattern!r} does not format ({exc!r}); use {{id}}, {{docker_id}} "
                          f"or {{repo}}") from None
    return out, image


def read_records(path: Path, image_pattern: str) -> list[tuple[dict, str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: cannot read it ({exc.__class__.__name__}: {exc}); pass a JSONL file of "
                          f"SWE-bench records") from None
    out: list[tuple[dict, str]] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record, image = normalize(json.loads(line), image_pattern)
        except RecordError as exc:
            raise RecordError(f"{path} line {n}: {exc}") from None
        except ValueError as exc:
            raise RecordError(f"{path} line {n}: not JSON ({exc})") from None
        if record["instance_id"] in seen:
            raise RecordError(f"{path} line {n}: instance_id {record['instance_id']} again (first on line "
                              f"{seen[record['instance_id']]}); ids name directories, so each must be unique")
        seen[record["instance_id"]] = n
        out.append((record, image))
    if not out:
        raise RecordError(f"{path}: no records; pass a JSONL file of SWE-bench records")
    return out


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string for these values (no control characters kept)


def task_toml(record: dict, image: str, args) -> str:
    return "\n".join([
        'version = "1.0"', "",
        "[metadata]", 'source = "swe-bench"', f"instance_id = {toml_str(record['instance_id'])}",
        f"repo = {toml_str(record['repo'])}", "",
        "[agent]", f"timeout_sec = {args.agent_timeout}", "",
        "[verifier]", f"timeout_sec = {args.verify_timeout}", "",
        "[environment]", f"docker_image = {toml_str(image)}", f"cpus = {args.cpus}", f"memory_mb = {args.memory_mb}",
        f"storage_mb = {args.storage_mb}", ""])


def task_files(record: dict, image: str, args) -> dict[str, str]:
    """Rule 2: a task's files, relative path -> text."""
    files = {"task.toml": task_toml(record, image, args),
             "instruction.md": record["problem_statement"].rstrip("\n") + "\n",
             "tests/config.json": json.dumps(record, indent=2, ensure_ascii=False) + "\n",
             "tests/test.sh": TEST_SH,
             "tests/grade.py": GRADER.read_text(encoding="utf-8")}
    if isinstance(record.get("patch"), str) and record["patch"].strip():
        files["solution/solve.sh"] = solve_script(record["patch"])
    return files


def write_task(dest: Path, files: dict[str, str]) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    for rel, text in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if rel.endswith(".sh"):
            path.chmod(0o755)


def from_swebench(args) -> int:
    records = read_records(Path(args.records), args.image_pattern)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise RecordError(f"--out {out} is a file; pass a directory")
    taken = [r["instance_id"] for r, _ in records if (out / r["instance_id"]).exists()]
    if taken and not args.force:
        raise RecordError(f"--out {out} already holds {', '.join(taken[:3])}{' …' if len(taken) > 3 else ''}; pass "
                          f"--force to rewrite them, or another --out")
    planned = [(out / r["instance_id"], task_files(r, image, args)) for r, image in records]  # every error first
    for dest, files in planned:
        write_task(dest, files)
    print(f"wrote {len(planned)} task(s) to {out}")
    return 0


def parser() -> OneLineParser:
    top = OneLineParser(prog="polar-tasks", description="Write tasks in Harbor's layout from other formats.")
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser("from-swebench", help="SWE-bench / SWE-Gym records (JSONL) as tasks",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("records", metavar="RECORDS.jsonl")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder the tasks are written in")
    p.add_argument("--image-pattern", default=DEFAULT_PATTERN,
                   help="each task's image, over {id}, {docker_id} and {repo} (default: %(default)s)")
    p.add_argument("--cpus", type=positive_int, default=1)
    p.add_argument("--memory-mb", type=positive_int, default=4096)
    p.add_argument("--storage-mb", type=positive_int, default=10240)
    p.add_argument("--agent-timeout", type=positive_int, default=1800, metavar="S")
    p.add_argument("--verify-timeout", type=positive_int, default=900, metavar="S")
    p.add_argument("--force", action="store_true", help="rewrite tasks that are already in --out")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return from_swebench(args)
    except RecordError as exc:
        print(f"polar-tasks: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
