"""A rollout RUN's results.jsonl, read: one line per attempt of a sample (`task`, `k`, `attempt`, `status`, `reward`,
`group`, `session`, …; docs/contracts.md#polar-rollout), and the one rule every reader applies to it — a sample's
latest line is its highest `attempt`; of two lines for the same attempt, the later one.

The rollout's ledger writes the file and keeps its rewards.jsonl and summary by this rule; the trainer's rollout stage
and the integrations read a step's results through `read_latest`. Standard library only: it is imported from the
proxy's environment and from .venv-train alike.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable


def latest_by_sample(lines: Iterable[dict]) -> dict[tuple[str, int], dict]:
    """Each sample's latest line (the highest attempt; the later line for the same attempt), by (task, k)."""
    out: dict[tuple[str, int], dict] = {}
    for line in lines:
        key = (line.get("task"), line.get("k"))
        old = out.get(key)
        if old is None or (line.get("attempt") or 0) >= (old.get("attempt") or 0):
            out[key] = line
    return out


def read_lines(path: str | os.PathLike) -> list[dict]:
    """Every line of a results.jsonl that holds a JSON object ([] without the file). A line that does not — a torn
    last line, which the ledger cuts on its next append — is skipped."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict):
                    out.append(doc)
    except FileNotFoundError:
        return []
    return out


def read_latest(path: str | os.PathLike) -> dict[tuple[str, int], dict]:
    """results.jsonl's latest line per sample (see the module's rule)."""
    return latest_by_sample(read_lines(path))
