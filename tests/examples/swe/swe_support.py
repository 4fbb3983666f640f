"""What the examples/swe tests share: the tasks, their records, a testbed at a task's base commit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SWE = ROOT / "examples" / "swe"
TASKS = tuple(sorted(p.parent.name for p in SWE.glob("*/task.toml")))


def record(task: str) -> dict:
    return json.loads((SWE / task / "tests" / "config.json").read_text())


def base_tree(task: str, dest: Path) -> Path:
    """The task's repository at base_commit, as the image's /testbed holds it (a clone of tests/base.bundle)."""
    subprocess.run(["git", "clone", "-q", str(SWE / task / "tests" / "base.bundle"), str(dest)], check=True)
    return dest


def apply_patch(tree: Path, patch: str) -> None:
    subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=tree, input=patch, text=True, check=True)


def failing(reward: dict) -> list[str]:
    """The tests reward.json says did not pass, sorted."""
    return sorted(t for t, s in reward["tests"].items() if s not in ("PASSED", "XFAIL"))
