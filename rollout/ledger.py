"""The results ledger: the result row (the one contract between a sample, results.jsonl, rewards.jsonl, the
summary and polar-train), RUN/results.jsonl (appended by one writer, a torn last line cut) and RUN/rewards.jsonl.

A sample's status follows this table; only the statuses with a reward reach rewards.jsonl (and so the advantages):

    completed       agent exit 0, ≥ 1 call with token ids     verified     the verifier's reward
    agent_error     non-zero exit after ≥ 1 call with ids     verified     the verifier's reward
    agent_timeout   the agent ran out of time, ≥ 1 call with ids         0.0
    verifier_timeout  the verifier ran out of time            —            0.0
    infra_error     no call with token ids, a sandbox or proxy failure     none
    verifier_error  no / malformed / non-finite reward                     none
    cancelled       Ctrl-C, or the runner died (found at --resume)         none

`calls` is the number of the attempt's model calls (records of its session), `trainable_tokens` the tokens the
model sampled in them; "a call with token ids" is a record whose completion has token ids. The counts are taken
once the proxy has written the records of the calls the agent was in when it ended (rollout/flowwatch.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from polar.records.files import write_atomic
from polar.records.results import latest_by_sample
from polar.rollout.common import UsageError

STATUSES = ("completed", "agent_error", "agent_timeout", "verifier_timeout", "verifier_error", "infra_error",
            "cancelled")
REWARDED = frozenset({"completed", "agent_error", "agent_timeout", "verifier_timeout"})
PHASES = ("setup", "agent", "verify", "teardown")


def _timings() -> dict[str, float]:
    return {p: 0.0 for p in PHASES}


@dataclass(frozen=True)
class ResultRow:
    """One line of results.jsonl: one attempt of one sample. Its keys, in this order, are RESULT_FIELDS."""

    run_id: str
    session: str
    group: str
    task: str
    k: int
    attempt: int
    agent: str | None = None
    sandbox: str | None = None
    status: str | None = None  # one of STATUSES
    reward: float | None = None  # set for REWARDED statuses only
    reward_details: Any = None  # reward.json's object, when it was one
    agent_exit: int | None = None  # None when the agent timed out (or never ran)
    calls: int = 0
    trainable_tokens: int = 0
    turn_scores: Any = None  # --turn-states: each main-chain call's state score and the final's; None: unscored
    t_start: float | None = None
    t_end: float | None = None
    timings: dict[str, float] = field(default_factory=_timings)  # seconds per phase (PHASES)
    error: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.k)

    @property
    def rewarded(self) -> bool:
        return self.status in REWARDED and self.reward is not None

    def to_json(self) -> dict:
        return {f: getattr(self, f) for f in RESULT_FIELDS}

    @classmethod
    def from_json(cls, doc: dict) -> ResultRow:
        """A row from a results.jsonl object (or a draft dict): its RESULT_FIELDS, keys of no field dropped; an
        absent key takes its default (null for the identity keys, as results.jsonl has always written them)."""
        return cls(**{**dict.fromkeys(_IDENTITY), **{f: doc[f] for f in RESULT_FIELDS if f in doc}})

    def replace(self, **changes: Any) -> ResultRow:
        return dataclasses.replace(self, **changes)


RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(ResultRow))
_IDENTITY = tuple(f.name for f in dataclasses.fields(ResultRow) if f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING)


class Results:
    """RUN/results.jsonl: read (a torn last line is reported and ignored, and cut before the next append), append."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self.torn: str | None = None

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        data = self.path.read_bytes()
        lines, out = data.split(b"\n"), []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if not isinstance(doc, dict):
                    raise ValueError("not an object")
                out.append(doc)
            except ValueError:
                if i == len(lines) - 1:  # the last line, without its newline: a write cut short
                    self.torn = f"{self.path}: a torn last line ({len(line)} bytes) is ignored"
                    continue
                raise UsageError(f"{self.path} line {i + 1} is not a JSON object; fix or remove it") from None
        return out

    def repair(self) -> None:
        """Cut a torn last line, so the next append starts on a line of its own."""
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as fh:
                fh.truncate(cut)

    def append(self, row: ResultRow | dict) -> None:
        doc = (row if isinstance(row, ResultRow) else ResultRow.from_json(row)).to_json()
        blob = (json.dumps(doc, allow_nan=False) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, blob)
                os.fsync(fd)
            finally:
                os.close(fd)


def rewards_lines(lines: Iterable[dict], carry: Callable[[dict], dict] | None = None) -> list[dict]:
    """rewards.jsonl: the latest attempt per sample, rewarded statuses only, reward exactly as in results; `carry`
    adds a line's keys for polar-process's sft.jsonl (`resolved`, `patch`: rollout/patches.py)."""
    lines = list(lines)
    out = []
    for _, line in sorted(latest_by_sample(lines).items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        if line.get("status") in REWARDED and line.get("reward") is not None:
            out.append({"session": line["session"], "reward": line["reward"], "group": line["group"],
                        **(carry(line) if carry is not None else {})})
    # A session's turn_scores ride with its reward line into polar-process (--credit turn); none: no key.
    scores = {ln.get("session"): ln.get("turn_scores") for ln in latest_by_sample(lines).values()}
    return [{**item, "turn_scores": scores[item["session"]]} if scores.get(item["session"]) is not None else item
            for item in out]


def write_rewards(path: Path, lines: list[dict], carry: Callable[[dict], dict] | None = None) -> None:
    """RUN/rewards.jsonl from results.jsonl's lines, replaced whole."""
    write_atomic(path, "".join(json.dumps(item, allow_nan=False, ensure_ascii=False) + "\n"
                               for item in rewards_lines(lines, carry)))
