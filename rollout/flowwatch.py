"""Watching the flow directory: per session, how many calls the proxy recorded, how many carry token ids, and how
many tokens the model sampled in them — skimmed (`polar.records.skim_file`: only a record's session and completion
ids are built), each file read on from where the last look ended.

The proxy writes a call's record when the call ends; a call the agent was still in when its sandbox was killed ends
only when the proxy next writes to the agent (a `client_abort` record, its tokens so far kept). `settled_counts`
waits for those before a sample's status is decided from the counts."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import NamedTuple

from polar import records as rec

SKIMMED = frozenset({"session", "completion_token_ids"})
SETTLE_S = 30.0  # at most this long after an agent ends, for the record of a call it was in
SETTLE_POLL_S = 0.2


class Counts(NamedTuple):
    calls: int
    with_ids: int  # calls whose completion has token ids
    tokens: int  # the tokens the model sampled in them


class _FileCounts:
    __slots__ = ("end", "per")

    def __init__(self) -> None:
        self.end = 0  # where the last whole record read ends
        self.per: dict[str, list[int]] = {}


class FlowCounter:
    """Per session: records, records with token ids, sampled tokens. A file is read on from the end of its last
    whole record when it grew, and again from its start when it shrank (cut back to its last whole record); a
    renamed `.open` file is read once more under its new name."""

    def __init__(self, flows: Path):
        self.flows = flows
        self._lock = threading.Lock()
        self._files: dict[str, _FileCounts] = {}

    def _paths(self) -> list[str]:
        try:
            return rec.expand_inputs([str(self.flows)]) if self.flows.is_dir() else []
        except FileNotFoundError:
            return []

    def _read_on(self, path: str, size: int) -> None:
        got = self._files.get(path)
        if got is None or size < got.end:
            got = _FileCounts()
        end, per = got.end, {s: list(c) for s, c in got.per.items()}
        try:
            for _, end, fields in rec.skim_file(path, SKIMMED, start=end):
                s = fields.get("session")
                if not isinstance(s, str):
                    continue
                c = per.setdefault(s, [0, 0, 0])
                c[0] += 1
                ids = fields.get("completion_token_ids")
                if isinstance(ids, bytes) and len(ids) >= 4:
                    c[1] += 1
                    c[2] += len(ids) // 4
        except (OSError, rec.SchemaError, ValueError):
            return  # looked at again next time
        got.end, got.per = end, per
        self._files[path] = got

    def _refresh(self) -> None:
        paths = self._paths()
        for path in paths:
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if path not in self._files or self._files[path].end != size:
                self._read_on(path, size)
        for gone in set(self._files) - set(paths):
            del self._files[gone]

    def counts(self, session: str) -> Counts:
        """(calls, calls with token ids, sampled tokens) of `session`."""
        with self._lock:
            self._refresh()
            out = [0, 0, 0]
            for got in self._files.values():
                for i, v in enumerate(got.per.get(session, (0, 0, 0))):
                    out[i] += v
            return Counts(*out)

    def records(self, session: str, since: float = 0.0) -> list[dict]:
        """The session's records as stored (not normalized), in file order, from files written since `since`."""
        out = []
        for path in self._paths():
            with contextlib.suppress(OSError, rec.SchemaError):
                if os.path.getmtime(path) < since:
                    continue
                out.extend(r for _, r in rec.iter_file(path, raw=True) if r.get("session") == session)
        return out


def settled_counts(counter: FlowCounter, session: str, *, connections: int, stop=None,
                   settle_s: float = SETTLE_S) -> Counts:
    """The session's counts once the proxy has written the records of the calls the agent was in when it ended.

    Nothing is awaited when a call with token ids is already recorded, or when the agent opened no connection to
    the proxy (`connections`, its sandbox relay's count: no call can be in flight). Otherwise the records are
    polled for up to `settle_s`, until one with token ids appears or `stop()` (a cancel) is true."""
    got = counter.counts(session)
    deadline = time.monotonic() + settle_s
    while got.with_ids == 0 and connections > 0 and time.monotonic() < deadline and not (stop and stop()):
        time.sleep(SETTLE_POLL_S)
        got = counter.counts(session)
    return got


_COUNTERS: dict[str, FlowCounter] = {}
_COUNTERS_LOCK = threading.Lock()


def flow_counter(flows: str | Path) -> FlowCounter:
    """One counter per flow directory and process (its per-file cache is shared by the samples)."""
    key = os.path.abspath(flows)
    with _COUNTERS_LOCK:
        if key not in _COUNTERS:
            _COUNTERS[key] = FlowCounter(Path(key))
        return _COUNTERS[key]
