"""Which records of a flow directory belong to which session: the index behind exact mode's rebuild of a session's
turns after a restart (docs/architecture.md#exact-mode).

- Built lazily, at the first `no_parent` miss, and extended at every later one (`refresh`): a file is read once,
  from where the previous pass stopped. Closed files never change; a `.open` file is read again only when it
  grew. A miss therefore costs a directory listing plus the bytes written since the previous miss, however big
  the directory.
- The index pass skims each record (`polar.records.skim_file`): only the small fields it was asked for (`fields`)
  are built, big values are skipped unbuilt. A record is kept when `keep(fields)` says so, as (file, offset,
  length, t_end): 32 bytes, however big the record.
- `session_records` reads one session's records back with positioned reads, in the order their writer wrote them
  (per writer — host and pid in the file name — by file name and offset; writers interleaved by `t_end`), and
  rebuilds compact prompts (`polar.records.PromptResolver`) on the way.
- Trouble never raises out of a pass: a file that is not a flow file, undecodable bytes, a torn tail in a closed
  file are skipped from there, counted in `bad_files` and logged once; a torn tail in a `.open` file is a record
  being written, read at a later pass. A record that cannot be read back is counted in the caller's `ReadStats`.

Imports: the standard library and `polar.records` only (flow file names, the skim and positioned reads are its).
Not thread-safe: one pass or read at a time (exact mode runs them in a worker thread under its lock).
"""

from __future__ import annotations

import array
import heapq
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from polar import records as rec

log = logging.getLogger("polar.exact")

_SLOTS = 4  # per indexed record: file number, offset, length, t_end in microseconds


@dataclass
class _File:
    no: int
    stem: str            # the name without its suffix: one writer's files sort in the order it wrote them
    name: str            # its current name (a `.open` file is renamed when closed)
    writer: str          # host-pid from the name
    offset: int = 0      # every whole record before this offset is indexed
    size: int = -1       # the size at the last pass
    done: bool = False   # closed and read to its end, or unreadable from `offset` on

    @property
    def is_open(self) -> bool:
        return self.name.endswith(rec.OPEN_SUFFIX)


@dataclass
class PassStats:
    """What one `refresh` did."""

    files_read: int = 0
    bytes_read: int = 0
    records_kept: int = 0
    partial: int = 0      # `.open` files ending in a record still being written


@dataclass
class ReadStats:
    """What reading one session's records back found."""

    read: int = 0
    unreadable: list[str] = field(default_factory=list)   # "file@offset: why"
    unresolved: list[str] = field(default_factory=list)   # ids whose compact prompt could not be rebuilt


def _writer(stem: str) -> str:
    """host-pid of a writer's file name (`polar.records.WriterName`); a name of another shape is its own writer."""
    name = rec.WriterName.parse(stem)
    return name.writer if name is not None else stem


class TurnIndex:
    """Session → the places of its kept records in one flow directory."""

    def __init__(self, directory: str, fields: frozenset, keep: Callable[[dict], bool]):
        self.directory = directory
        self.fields = frozenset(fields) | {"v", "session", "t_end"}
        self.keep = keep
        self.files: dict[str, _File] = {}               # by stem: the name without its suffix
        self._by_no: list[_File] = []
        self.sessions: dict[str | None, array.array] = {}
        self.bad_files: dict[str, str] = {}             # stem → why part of it was skipped
        self.records = 0

    # ------------------------------------------------------------------------------------------ index pass

    def refresh(self) -> PassStats:
        """Index what was written since the last pass. Raises OSError only when the directory cannot be listed."""
        stats = PassStats()
        for name in sorted(os.listdir(self.directory)):
            stem = rec.flow_stem(name)
            if stem is None:
                continue
            f = self.files.get(stem)
            if f is None:
                f = self.files[stem] = _File(len(self._by_no), stem, name, _writer(stem))
                self._by_no.append(f)
            elif f.name != name and f.is_open:
                f.name = name  # closed since the last pass: nothing more will be appended
            if not f.done:
                self._scan_listed(f, stats)
        return stats

    def _scan_listed(self, f: _File, stats: PassStats) -> None:
        for attempt in (1, 2):
            try:
                return self._scan(f, stats)
            except FileNotFoundError:
                if attempt == 2 or not f.is_open:
                    return  # deleted since the listing: nothing to read
                f.name = rec.closed_name(f.name)  # closed by its writer since the listing
            except OSError as exc:  # logged once; tried again at the next pass
                return self._note(f, f"{f.name}: {exc.strerror or exc}")

    def _scan(self, f: _File, stats: PassStats) -> None:
        path = os.path.join(self.directory, f.name)
        size = os.path.getsize(path)
        if size == f.size:
            if not f.is_open:  # closed since the last pass, with nothing appended
                self._ended(f, path, size)
            return
        if f.offset == 0:
            problem = rec.sniff(path)
            if problem is not None:
                return self._bad(f, problem)
        stats.files_read += 1
        start = f.offset
        try:
            for at, end, got in rec.skim_file(path, self.fields, f.offset):
                stats.records_kept += self._add(f, at, end, got)
                start = end
        except rec.Undecodable as exc:
            stats.bytes_read += start - f.offset
            f.offset = start
            return self._bad(f, str(exc))
        stats.bytes_read += start - f.offset
        f.offset, f.size = start, size
        if f.is_open:
            stats.partial += start < size
        else:
            self._ended(f, path, size)

    def _ended(self, f: _File, path: str, size: int) -> None:
        """A closed file read up to f.offset: done, and a torn tail there is an error."""
        if f.offset < size:
            self._bad(f, rec.TornTail(path, f.offset, size - f.offset, False).describe())
        f.done = True

    def _add(self, f: _File, start: int, end: int, got: dict) -> bool:
        problem = rec.version_problem(got.get("v"))
        if problem is not None:
            self._note(f, f"{f.name} offset {start}: {problem}")
            return False
        session = got.get("session")
        if not self.keep(got) or not (session is None or isinstance(session, str)):
            return False
        t_end = got.get("t_end")
        t_us = int(t_end * 1e6) if isinstance(t_end, (int, float)) and not isinstance(t_end, bool) else 0
        self.sessions.setdefault(session, array.array("q")).extend((f.no, start, end - start, t_us))
        self.records += 1
        return True

    def _bad(self, f: _File, why: str) -> None:
        f.done = True
        self._note(f, why)

    def _note(self, f: _File, why: str) -> None:
        if f.stem not in self.bad_files:  # one line per file, however often it is passed over
            self.bad_files[f.stem] = why
            log.warning("polar_exact: rebuilds skip part of a flow file: %s", why)

    # ------------------------------------------------------------------------------------------ reading back

    def count(self, session) -> int:
        entries = self.sessions.get(session)
        return len(entries) // _SLOTS if entries is not None else 0

    def places(self, session) -> list[tuple[int, int, int]]:
        """(file number, offset, length) of the session's kept records, in the order their writers wrote them."""
        entries = self.sessions.get(session)
        if not entries:
            return []
        by_writer: dict[str, list[tuple]] = {}
        for i in range(0, len(entries), _SLOTS):
            no, offset, length, t_us = entries[i:i + _SLOTS]
            f = self._by_no[no]
            by_writer.setdefault(f.writer, []).append((f.stem, offset, t_us, no, length))
        runs = [sorted(run) for run in by_writer.values()]
        return [(no, offset, length) for _, offset, _, no, length in heapq.merge(*runs, key=lambda e: e[2])]

    def session_records(self, session, stats: ReadStats, resolver_bytes: int = 64 << 20) -> Iterator[dict]:
        """The session's kept records, whole and checked (`polar.records.normalize`), compact prompts rebuilt, in the
        order of `places`. A record that cannot be read is counted in `stats` and left out."""
        resolver = rec.PromptResolver(max_bytes=resolver_bytes)
        fds: dict[int, int] = {}
        try:
            for no, offset, length in self.places(session):
                record = self._read(fds, no, offset, length, stats)
                if record is None:
                    continue
                stats.read += 1
                n = len(resolver.unresolved)
                resolver.resolve(record)
                if len(resolver.unresolved) > n:
                    stats.unresolved.append(str(record.get("id")))
                yield record
        finally:
            for fd in fds.values():
                os.close(fd)

    def _read(self, fds: dict[int, int], no: int, offset: int, length: int, stats: ReadStats) -> dict | None:
        f = self._by_no[no]
        try:
            fd = fds.get(no)
            if fd is None:
                fd = fds[no] = self._open(f)
            return rec.record_at(fd, offset, length)
        except (OSError, *rec.RECORD_ERRORS) as exc:
            stats.unreadable.append(f"{f.name}@{offset}: {exc}")
            return None

    def _open(self, f: _File) -> int:
        try:
            return os.open(os.path.join(self.directory, f.name), os.O_RDONLY)
        except FileNotFoundError:
            if not f.is_open:
                raise
            f.name = rec.closed_name(f.name)  # closed since the last pass
            return os.open(os.path.join(self.directory, f.name), os.O_RDONLY)
