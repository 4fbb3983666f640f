"""report.json as a typed contract: the document polar-process writes (`ReportBuilder.build` gives a `Report`), the
`verify` key polar-verify adds (`add_verify`), and the one reader for code that reads it back (`read_report`).

Every key keeps its name and meaning (docs/merge-rules.md#outputs, docs/contracts.md): `Report.to_json()` writes the
same document, key for key and in the same order, that polar-process wrote before the contract had types, and
`Report.from_json` reads it back whole (test: tests/processor/test_report_doc.py). A record's optional keys
(`counts.sessions_other_prefix`, `incremental`, `verify`, ...) are left out when they are None; top-level keys this
version does not know are kept in `extra` and written back as they came.

No import of the rest of the processor: a reader (polar-rollout, polar-train) needs nothing else."""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import orjson

from polar.records.files import write_atomic

__all__ = ["REPORT_VERSION", "Counts", "Event", "Inputs", "Report", "ReportError", "RewardsJoin", "SessionRatio",
           "Tokens", "TornTail", "add_verify", "read_report", "write_report_json"]

REPORT_VERSION = 1


class ReportError(ValueError):
    """A file that is not a report.json this version can read: what is wrong, in one line."""


@dataclass(frozen=True)
class _Record:
    """Read from and written to one JSON object, field by field; NESTED names the fields that hold records (or
    arrays of records)."""

    NESTED: ClassVar[dict[str, type]] = {}

    @classmethod
    def from_json(cls, doc: object, where: str = "report.json"):
        if not isinstance(doc, dict):
            raise ReportError(f"{where}: expected an object, not {type(doc).__name__}")
        kwargs = {}
        for f in fields(cls):
            if f.name == "extra":
                continue
            if f.name not in doc:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise ReportError(f"{where}: no {f.name!r}")
                continue
            value, sub = doc[f.name], cls.NESTED.get(f.name)
            if sub is not None and isinstance(value, list):
                value = tuple(sub.from_json(x, f"{where}.{f.name}[{i}]") for i, x in enumerate(value))
            elif sub is not None:
                value = sub.from_json(value, f"{where}.{f.name}")
            kwargs[f.name] = value
        if any(f.name == "extra" for f in fields(cls)):
            known = {f.name for f in fields(cls)}
            kwargs["extra"] = {k: v for k, v in doc.items() if k not in known}
        return cls(**kwargs)

    def to_json(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or value is None and f.default is None:
                continue
            if isinstance(value, _Record):
                value = value.to_json()
            elif isinstance(value, tuple):
                value = [x.to_json() if isinstance(x, _Record) else x for x in value]
            out[f.name] = value
        out.update(getattr(self, "extra", {}))
        return out


@dataclass(frozen=True)
class TornTail(_Record):
    """A flow file's unreadable tail: an error, or a writer still at work (`in_progress`)."""

    file: str
    offset: int
    bytes: int
    in_progress: bool
    message: str


@dataclass(frozen=True)
class Inputs(_Record):
    NESTED: ClassVar[dict[str, type]] = {"torn_tails": TornTail}

    files: int
    records: int
    bytes: int
    torn_tails: tuple[TornTail, ...]
    open_files: list[str]


@dataclass(frozen=True)
class Counts(_Record):
    """`sessions_null`: calls without a session. The two `*_other_prefix` counts only under --session-prefix.
    `calls_prompt_ascii`: calls whose prompt ids the gateway kept as the backend's ASCII digits (its fast path; the
    rest were parsed, or written before record v3)."""

    calls: int
    calls_without_completion: int
    sessions: int
    sessions_null: int
    chains: int
    sequences: int
    excluded_from_batches: int
    calls_prompt_ascii: int = 0
    sessions_other_prefix: int | None = None
    calls_other_prefix: int | None = None


@dataclass(frozen=True)
class Tokens(_Record):
    """Tokens in sequences (`total`, `trainable`), what per_request would send, and Σ prompt + completion."""

    total: int
    trainable: int
    per_request_total: int
    records_total: int


@dataclass(frozen=True)
class Event(_Record):
    """A break (`breaks`) or a flag set on a sequence (`flag_events`), where it happened."""

    session: str | None
    chain_id: str
    call_id: str
    cause: str
    token_pos: int | None


@dataclass(frozen=True)
class RewardsJoin(_Record):
    joined: int
    missing: int
    unmatched_lines: int
    unmatched_sessions: list[str]
    # --credit turn only: sessions whose calls got turn terms, and rewarded grouped sessions that fell back to
    # session credit (turn_scores null, or fewer than two scored sessions in their group)
    turn_credit: int | None = None
    turn_fallback: int | None = None


@dataclass(frozen=True)
class SessionRatio(_Record):
    session: str
    calls: int
    sequences: int
    merge_ratio: float


@dataclass(frozen=True)
class Report(_Record):
    """report.json. `merge_ratio`: calls in sequences ÷ sequences (None without sequences); `per_protocol` and
    `per_model`, `per_replica` (by the serving replica's base URL): rows of counts that add up to the totals; `eot`: each model's end-of-turn ids and their source;
    `engine`: the engine's facts; `incremental`: what --incremental reused; `verify`: polar-verify's summary."""

    NESTED: ClassVar[dict[str, type]] = {"inputs": Inputs, "counts": Counts, "tokens": Tokens, "breaks": Event,
                                         "flag_events": Event, "rewards": RewardsJoin, "sessions": SessionRatio}

    version: int
    mode: str
    inputs: Inputs
    counts: Counts
    merge_ratio: float | None
    tokens: Tokens
    breaks: tuple[Event, ...]
    break_causes: dict[str, int]
    flags: dict[str, int]
    flag_events: tuple[Event, ...]
    rewards: RewardsJoin
    warnings: list[str]
    eot: dict[str, Any]
    per_protocol: dict[str, dict[str, int]]
    per_model: dict[str, dict[str, int]]
    sessions: tuple[SessionRatio, ...]
    options: dict[str, Any]
    outputs: dict[str, Any]
    seconds: float
    tokens_per_second: int | None
    engine: dict[str, Any] | None = None
    incremental: dict[str, Any] | None = None
    verify: dict[str, Any] | None = None
    per_replica: dict[str, dict[str, int]] = field(default_factory=dict)  # absent from older report.json: {}
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: object, where: str = "report.json") -> Report:
        if isinstance(doc, dict) and doc.get("version") != REPORT_VERSION:
            raise ReportError(f"{where}: version {doc.get('version')!r}, this reader knows {REPORT_VERSION}")
        return super().from_json(doc, where)


def read_report(path: str | os.PathLike) -> Report:
    """OUT/report.json, typed. Raises OSError when it cannot be read, ReportError when it is not a report."""
    with open(path, "rb") as fh:
        try:
            doc = orjson.loads(fh.read())
        except orjson.JSONDecodeError as exc:
            raise ReportError(f"{path}: not JSON ({exc})") from None
    return Report.from_json(doc, str(path))


def _atomic_write(path: str | os.PathLike, doc: dict) -> None:
    write_atomic(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def write_report_json(path: str | os.PathLike, report: Report) -> None:
    """report.json, replaced atomically."""
    _atomic_write(path, report.to_json())


def add_verify(path: str | os.PathLike, summary: dict) -> None:
    """polar-verify's summary as report.json's `verify`, every other key left as it was; replaced atomically.
    Raises as read_report does when the file is not a report."""
    with open(path, "rb") as fh:
        doc = orjson.loads(fh.read())
    Report.from_json(doc, str(path))  # only a report gets a verify key
    doc["verify"] = summary
    _atomic_write(path, doc)
