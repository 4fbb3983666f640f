"""The seam where an engine fans session groups out: what crosses it, the unit it runs, and the local engine.

`group_products` is a pure function of one group's records plus the run's `Settings`: normalize → merge → rewards,
and everything the outputs need from the group (`GroupProducts`: calls rows, sequences, SFT lines, its share of the
report). An engine does two things: the index pass over a list of files, and `groups`: the products of a list of
groups, answered in the order asked. `LocalEngine` does both in this process; `engine_ray.RayEngine` runs them as
Ray tasks (sessions partitioned by `partition_of`, a stable hash). Whatever the engine, the driver (pipeline.py)
writes every output in the same order, so the outputs are byte-for-byte the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from polar.processor import eot as eotmod
from polar.processor import rewards as rw
from polar.processor.load import Index, IndexEntry, RecordSource, build_index
from polar.processor.merge import FLAGS, GroupResult, TrainingSequence, merge_group
from polar.processor.normalize import AsciiPrompts, Call, to_call
from polar.processor.report_counts import ReportPartial
from polar.processor.writers import sft_line


@dataclass(frozen=True)
class Settings:
    """What a group's processing needs besides its records (picklable, for fan-out)."""

    mode: str
    on_mismatch: str
    max_batch_tokens: int
    side_chains: str
    eot: eotmod.EotTable
    rewards: rw.Rewards
    compaction: str = "train"  # rule 12: a compaction call's tokens trained, or masked

    @property
    def eot_watch(self) -> frozenset[int]:
        """Ids the user named with `--eot-token-id`: the report says which never occur in the dump."""
        return self.eot.default if self.eot.default_source == "--eot-token-id" and self.eot.default else frozenset()


@dataclass
class GroupProducts:
    """What one group contributes to the outputs, in the driver's write order. Picklable and free of record bytes
    (an engine ships it back from a worker): calls rows, sequences with rewards, its SFT lines before
    `--sft-min-reward`, and its share of the report."""

    session: str | None
    call_rows: list[dict]
    sequences: list[TrainingSequence]
    sft_lines: list[bytes]
    report: ReportPartial


def group_products(session: str | None, records: list[tuple[IndexEntry, dict]], files: list[str],
                   settings: Settings) -> GroupProducts:
    """One session group (or the null group) → its calls rows, sequences with rewards, SFT lines and report share.
    Pure: the unit an engine runs anywhere."""
    prompts = AsciiPrompts()
    calls = [to_call(r, files[e.file], e.offset, prompts) for e, r in records]
    res = merge_group(calls, mode=settings.mode, eot_for=settings.eot.get, on_mismatch=settings.on_mismatch,
                      null_group=session is None, compaction=settings.compaction)
    for seq in res.sequences:
        if seq.n_tokens > settings.max_batch_tokens:
            seq.flags = [f for f in FLAGS if f in {*seq.flags, "oversize"}]
        rw.apply(seq, settings.rewards, settings.side_chains)
    return GroupProducts(session, _call_rows(calls, res), res.sequences, _sft_lines(res),
                         ReportPartial.of(session, calls, res, settings.eot_watch))


def _call_rows(calls: list[Call], res: GroupResult) -> list[dict]:
    """calls.parquet rows: each call's row plus the sequence and chain it went to (null: in none)."""
    rows = []
    for c in calls:
        sid, cid = res.placement.get(c.id, (None, None))
        rows.append({**c.row, "sequence_id": sid, "chain_id": cid})
    return rows


def _sft_lines(res: GroupResult) -> list[bytes]:
    lines = []
    for call in res.sft_calls:
        line = sft_line(call.messages_json, call.tools_json, call.assistant)
        if line is not None:
            lines.append(line)
    return lines


def partition_of(session: str | None, n: int) -> int:
    """The partition (0..n-1) of a session: a stable hash (blake2b), the same in every process and every run,
    unlike Python's salted hash(). The null-session group is one group, so it has one partition."""
    key = b"\x00null" if session is None else b"s" + session.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % n


Work = list[tuple[str | None, list[IndexEntry]]]  # (session, its index entries) per group, in the driver's order


class Engine(Protocol):
    """What the driver asks of an engine."""

    name: str

    def index(self, files: list[str], progress: Callable[[int, int], None] | None = None) -> Index:
        """The index pass over `files` (in that order)."""

    def groups(self, work: Work, files: list[str], settings: Settings) -> Iterator[GroupProducts]:
        """`group_products` of each of `work`'s groups, in `work`'s order."""

    def stats(self) -> dict:
        """Engine facts for report.json."""

    def close(self) -> None:
        ...


class LocalEngine:
    """Both passes in this process, one group at a time: memory is bounded by the largest group."""

    name = "local"

    def index(self, files: list[str], progress: Callable[[int, int], None] | None = None) -> Index:
        return build_index(files, progress) if files else Index(files=[])

    def groups(self, work: Work, files: list[str], settings: Settings) -> Iterator[GroupProducts]:
        """Products of `work`'s groups, in `work`'s order."""
        source = RecordSource(files)
        try:
            for session, entries in work:
                yield group_products(session, source.load(entries), files, settings)
        finally:
            source.close()

    def stats(self) -> dict:
        return {"name": self.name}

    def close(self) -> None:
        pass
