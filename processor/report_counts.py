"""The report's counting: `ReportPartial.of` counts one group wherever an engine runs it, and `ReportBuilder` adds the
groups' shares in the driver's order, so the report is the same for every engine and for groups an incremental run
carries over. `ReportBuilder.build` gives report.json's document (report_doc.Report)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from polar.processor.eot import occurring
from polar.processor.merge import FLAGS, GroupResult, Note
from polar.processor.normalize import Call
from polar.processor.report_doc import (REPORT_VERSION, Counts, Event, Inputs, Report, RewardsJoin, SessionRatio,
                                        Tokens, TornTail)


NO_REPLICA = "(not recorded)"  # records before v4, and calls refused before a replica was chosen


def _table_row() -> dict:
    return {"calls": 0, "calls_without_completion": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "sequences": 0, "trainable_tokens": 0}


@dataclass
class ReportPartial:
    """One group's share of the report (`of`), or the sum of shares (`add`): sums, notes and lists that add up group by
    group, so the report is the same whichever worker counted which group. It crosses from an engine's workers to
    the driver, and OUT/state/groups.jsonl keeps it (`to_json` / `from_json`) for the groups a later --incremental
    run carries over."""

    calls: int = 0
    calls_without_completion: int = 0
    calls_null_session: int = 0
    sessions: int = 0
    chains: int = 0
    sequences: int = 0
    calls_in_sequences: int = 0
    tokens_total: int = 0
    tokens_trainable: int = 0
    per_request_total: int = 0
    record_tokens: int = 0  # Σ prompt + completion over every record: the throughput measure
    calls_prompt_ascii: int = 0  # calls whose prompt ids came as ASCII ids (the gateway's fast path)
    breaks: list[Note] = field(default_factory=list)
    flag_notes: list[Note] = field(default_factory=list)
    flags: Counter = field(default_factory=Counter)
    break_causes: Counter = field(default_factory=Counter)
    per_protocol: dict[str, dict] = field(default_factory=dict)
    per_model: dict[str, dict] = field(default_factory=dict)
    per_replica: dict[str, dict] = field(default_factory=dict)  # by the record's `replica` ("(not recorded)": none)
    seq_lengths: list[int] = field(default_factory=list)
    session_ratios: list[tuple[str, int, int]] = field(default_factory=list)  # (session, calls, sequences)
    eot_ids_seen: list[int] = field(default_factory=list)  # watched end-of-turn ids found in the groups' tokens

    @classmethod
    def of(cls, session: str | None, calls: list[Call], res: GroupResult,
           eot_watch: frozenset[int] = frozenset()) -> ReportPartial:
        """Count one group. Per-protocol and per-model rows add up to the totals: a call counts under its own
        protocol and model, a sequence under its first call's (the one whose prompt it starts with).
        eot_watch: `--eot-token-id` ids to look for in the group's tokens (`eot.occurring`)."""
        part = cls(calls=len(calls), calls_null_session=len(calls) if session is None else 0,
                   sessions=0 if session is None else 1, chains=res.n_chains, breaks=list(res.breaks),
                   flag_notes=list(res.flag_notes))
        part._count_calls(calls)
        if eot_watch:
            part.eot_ids_seen = occurring([c for c in calls if c.eligible], eot_watch)
        part._count_sequences(session, calls, res)
        return part

    def _count_calls(self, calls: list[Call]) -> None:
        for c in calls:
            p = len(c.prompt) if c.prompt is not None else 0
            q = len(c.completion) if c.completion is not None else 0
            self.record_tokens += p + q
            self.calls_prompt_ascii += c.prompt_ascii
            if c.eligible:
                self.per_request_total += p + q
            else:
                self.calls_without_completion += 1
            for table, key in ((self.per_protocol, c.protocol), (self.per_model, c.model),
                               (self.per_replica, c.replica or NO_REPLICA)):
                row = table.setdefault(str(key), _table_row())
                row["calls"] += 1
                row["calls_without_completion"] += 0 if c.eligible else 1
                row["errors"] += 1 if c.row["error"] is not None else 0
                row["prompt_tokens"] += p
                row["completion_tokens"] += q

    def _count_sequences(self, session: str | None, calls: list[Call], res: GroupResult) -> None:
        protocol_of = {c.id: str(c.protocol) for c in calls}
        replica_of = {c.id: c.replica or NO_REPLICA for c in calls}
        n_in = 0
        for s in res.sequences:
            self.sequences += 1
            n_in += len(s.call_ids)
            self.tokens_total += s.n_tokens
            self.tokens_trainable += s.n_trainable
            self.seq_lengths.append(s.n_tokens)
            self.flags.update(s.flags)
            if s.break_cause:
                self.break_causes[s.break_cause] += 1
            for table, key in ((self.per_protocol, protocol_of[s.call_ids[0]]), (self.per_model, str(s.model)),
                               (self.per_replica, replica_of[s.call_ids[0]])):
                row = table.setdefault(key, _table_row())
                row["sequences"] += 1
                row["trainable_tokens"] += s.n_trainable
        self.calls_in_sequences += n_in
        if res.sequences:
            self.session_ratios.append(("(no session)" if session is None else session, n_in, len(res.sequences)))

    def add(self, other: ReportPartial) -> None:
        """Add another share: what counting both groups into one share gives."""
        self.calls += other.calls
        self.calls_without_completion += other.calls_without_completion
        self.calls_null_session += other.calls_null_session
        self.sessions += other.sessions
        self.chains += other.chains
        self.sequences += other.sequences
        self.calls_in_sequences += other.calls_in_sequences
        self.tokens_total += other.tokens_total
        self.tokens_trainable += other.tokens_trainable
        self.per_request_total += other.per_request_total
        self.record_tokens += other.record_tokens
        self.calls_prompt_ascii += other.calls_prompt_ascii
        self.breaks.extend(other.breaks)
        self.flag_notes.extend(other.flag_notes)
        self.flags.update(other.flags)
        self.break_causes.update(other.break_causes)
        _add_rows(self.per_protocol, other.per_protocol)
        _add_rows(self.per_model, other.per_model)
        _add_rows(self.per_replica, other.per_replica)
        self.seq_lengths.extend(other.seq_lengths)
        self.session_ratios.extend(other.session_ratios)
        self.eot_ids_seen = sorted({*self.eot_ids_seen, *other.eot_ids_seen})

    def to_json(self) -> dict:
        """As plain JSON values, for state/groups.jsonl (notes and ratios as arrays)."""
        return {
            "calls": self.calls, "calls_without_completion": self.calls_without_completion,
            "calls_null_session": self.calls_null_session, "sessions": self.sessions, "chains": self.chains,
            "sequences": self.sequences, "calls_in_sequences": self.calls_in_sequences,
            "tokens_total": self.tokens_total, "tokens_trainable": self.tokens_trainable,
            "per_request_total": self.per_request_total, "record_tokens": self.record_tokens,
            "calls_prompt_ascii": self.calls_prompt_ascii,
            "breaks": [_note_json(n) for n in self.breaks], "flag_notes": [_note_json(n) for n in self.flag_notes],
            "flags": dict(self.flags), "break_causes": dict(self.break_causes),
            "per_protocol": {k: dict(row) for k, row in self.per_protocol.items()},
            "per_model": {k: dict(row) for k, row in self.per_model.items()},
            "per_replica": {k: dict(row) for k, row in self.per_replica.items()},
            "seq_lengths": list(self.seq_lengths), "session_ratios": [list(x) for x in self.session_ratios],
            "eot_ids_seen": list(self.eot_ids_seen),
        }

    @classmethod
    def from_json(cls, doc: dict) -> ReportPartial:
        """The share `to_json` wrote."""
        return cls(
            calls=doc["calls"], calls_without_completion=doc["calls_without_completion"],
            calls_null_session=doc["calls_null_session"], sessions=doc["sessions"], chains=doc["chains"],
            sequences=doc["sequences"], calls_in_sequences=doc["calls_in_sequences"],
            tokens_total=doc["tokens_total"], tokens_trainable=doc["tokens_trainable"],
            per_request_total=doc["per_request_total"], record_tokens=doc["record_tokens"],
            calls_prompt_ascii=doc.get("calls_prompt_ascii", 0),  # state written before the field: none counted
            breaks=[Note(*x) for x in doc["breaks"]], flag_notes=[Note(*x) for x in doc["flag_notes"]],
            flags=Counter(doc["flags"]), break_causes=Counter(doc["break_causes"]),
            per_protocol={k: dict(row) for k, row in doc["per_protocol"].items()},
            per_model={k: dict(row) for k, row in doc["per_model"].items()},
            per_replica={k: dict(row) for k, row in doc.get("per_replica", {}).items()},  # older state: none
            seq_lengths=list(doc["seq_lengths"]), session_ratios=[tuple(x) for x in doc["session_ratios"]],
            eot_ids_seen=list(doc["eot_ids_seen"]),
        )


def _note_json(n: Note) -> list:
    return [n.session, n.chain_id, n.call_id, n.cause, n.token_pos]


def _add_rows(table: dict[str, dict], rows: dict[str, dict]) -> None:
    """Add a per-protocol or per-model table's rows into another, column by column."""
    for key, row in rows.items():
        into = table.setdefault(key, dict.fromkeys(row, 0))
        for col, n in row.items():
            into[col] += n


@dataclass
class ReportBuilder:
    """Adds the groups' shares in the driver's order; `build()` gives the report.json document."""

    mode: str
    totals: ReportPartial = field(default_factory=ReportPartial)
    excluded_from_batches: int = 0  # side chains left out of batches/: decided by the driver (--side-chains exclude)

    def add(self, part: ReportPartial) -> None:
        self.totals.add(part)

    def build(self, *, index, eot: dict, rewards, options: dict, outputs: dict, seconds: float,
              warnings: list[str] = (), engine: dict | None = None, other_prefix: tuple[int, int] | None = None,
              incremental: dict | None = None) -> Report:
        """The report.json document. other_prefix: (sessions, calls) --session-prefix left out, when given."""
        t = self.totals
        return Report(
            version=REPORT_VERSION, mode=self.mode,
            inputs=Inputs(files=len(index.files), records=len(index.entries), bytes=index.total_bytes,
                          torn_tails=tuple(TornTail(file=x.file, offset=x.offset, bytes=x.nbytes,
                                                    in_progress=x.in_progress, message=x.describe())
                                           for x in index.torn_tails),
                          open_files=index.open_files),
            counts=Counts(calls=t.calls, calls_without_completion=t.calls_without_completion, sessions=t.sessions,
                          sessions_null=t.calls_null_session, chains=t.chains, sequences=t.sequences,
                          excluded_from_batches=self.excluded_from_batches,
                          calls_prompt_ascii=t.calls_prompt_ascii,
                          sessions_other_prefix=other_prefix[0] if other_prefix else None,
                          calls_other_prefix=other_prefix[1] if other_prefix else None),
            merge_ratio=t.calls_in_sequences / t.sequences if t.sequences else None,
            tokens=Tokens(total=t.tokens_total, trainable=t.tokens_trainable, per_request_total=t.per_request_total,
                          records_total=t.record_tokens),
            breaks=tuple(map(_event, t.breaks)), break_causes=dict(t.break_causes),
            flags={f: t.flags.get(f, 0) for f in FLAGS}, flag_events=tuple(map(_event, t.flag_notes)),
            rewards=RewardsJoin(joined=rewards.joined, missing=rewards.missing,
                                unmatched_lines=rewards.unmatched_lines, unmatched_sessions=rewards.unmatched_sessions,
                                turn_credit=len(rewards.turn.terms) if rewards.turn else None,
                                turn_fallback=rewards.turn.fallback if rewards.turn else None),
            warnings=list(warnings), eot=eot, per_protocol=t.per_protocol, per_model=t.per_model,
            per_replica=t.per_replica,
            sessions=tuple(SessionRatio(session=s, calls=c, sequences=q, merge_ratio=c / q)
                           for s, c, q in t.session_ratios),
            options=options, outputs=outputs, seconds=round(seconds, 3),
            tokens_per_second=round(t.record_tokens / seconds) if seconds > 0 else None,
            engine=engine, incremental=incremental)


def _event(n: Note) -> Event:
    return Event(session=n.session, chain_id=n.chain_id, call_id=n.call_id, cause=n.cause, token_pos=n.token_pos)
