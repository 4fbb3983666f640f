"""tests/known-skips.txt, checked (issue 42): every skip the suite takes is listed with the condition under which it
skips, and that condition is a fact this module checks on the machine the session runs on. tests/conftest.py feeds
`check` each test's outcome at the end of a session (.venv's and .venv-train's alike) and fails the session on:

- a skip that no entry lists;
- a listed skip whose condition does not hold (it skipped for another reason than the one listed);
- a listed test that ran although its condition holds (the entry is stale, or the skip is gone).

Off CI, a skip from tests/support/need.py (something scripts/setup installs is missing here) needs no entry: under
CI=true need() fails instead of skipping, so it never reaches this list there. The file's own header documents its
format and the conditions. Standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

ROOT = Path(__file__).resolve().parents[2]
FILE = ROOT / "tests" / "known-skips.txt"
SKIPPED, RAN, NOT_INSTALLED = "skipped", "ran", "not-installed"  # a test's outcome, as the hook saw it


def _path_absent(arg: str, env: Mapping[str, str], root: Path) -> bool:
    return not (root / arg).exists()


def _env_not(arg: str, env: Mapping[str, str], root: Path) -> bool:
    name, sep, value = arg.partition("=")
    if not sep or not name:
        raise ValueError(f"env-not:{arg}: expected env-not:NAME=VALUE")
    return env.get(name) != value


def cpu_vendor() -> str | None:
    """This machine's CPU vendor (/proc/cpuinfo's vendor_id: AuthenticAMD, GenuineIntel, …), None where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _cpu_not(arg: str, env: Mapping[str, str], root: Path) -> bool:
    return cpu_vendor() != arg


CONDITIONS = {"path-absent": _path_absent, "env-not": _env_not, "cpu-not": _cpu_not}


@dataclass(frozen=True)
class Entry:
    test: str  # a node id; `*` stands for any text
    condition: str  # KIND:ARG, KIND one of CONDITIONS
    reason: str
    line: int

    def matches(self, nodeid: str) -> bool:
        return re.fullmatch(".*".join(map(re.escape, self.test.split("*"))), nodeid) is not None

    def holds(self, env: Mapping[str, str] = os.environ, root: Path = ROOT) -> bool:
        kind, _, arg = self.condition.partition(":")
        return CONDITIONS[kind](arg, env, root)


def parse(text: str, name: str = "tests/known-skips.txt") -> list[Entry]:
    """The entries of the file's text; ValueError naming the line for a malformed one."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(" | ")]
        if len(fields) != 3 or not all(fields):
            raise ValueError(f"{name}:{n}: expected TEST-ID | CONDITION | REASON, got {line!r}")
        test, condition, reason = fields
        kind, sep, arg = condition.partition(":")
        if kind not in CONDITIONS or not sep or not arg:
            raise ValueError(f"{name}:{n}: unknown condition {condition!r} (one of: "
                             f"{', '.join(k + ':…' for k in CONDITIONS)})")
        if kind == "env-not" and "=" not in arg:
            raise ValueError(f"{name}:{n}: expected env-not:NAME=VALUE, got {condition!r}")
        out.append(Entry(test, condition, reason, n))
    return out


def load(path: Path = FILE) -> list[Entry]:
    return parse(path.read_text(), os.path.relpath(path, ROOT))


def check(entries: list[Entry], outcomes: Mapping[str, tuple[str, str]], env: Mapping[str, str] = os.environ,
          root: Path = ROOT) -> list[str]:
    """One line per problem. `outcomes`: node id → (SKIPPED | RAN | NOT_INSTALLED, the skip's reason or "")."""
    problems = []
    for nodeid, (outcome, reason) in outcomes.items():
        if outcome == NOT_INSTALLED:
            continue
        entry = next((e for e in entries if e.matches(nodeid)), None)
        if outcome == SKIPPED and entry is None:
            problems.append(f"{nodeid} skipped ({reason}) but tests/known-skips.txt has no entry for it")
        elif outcome == SKIPPED and not entry.holds(env, root):
            problems.append(f"{nodeid} skipped ({reason}) but its condition {entry.condition} does not hold "
                            f"(tests/known-skips.txt:{entry.line})")
        elif outcome == RAN and entry is not None and entry.holds(env, root):
            problems.append(f"{nodeid} ran although its condition {entry.condition} holds "
                            f"(tests/known-skips.txt:{entry.line}): a stale entry, or a skip that is gone")
    return problems
