"""Pass 1 (index) and pass 2 (load one session) over flow files (docs/merge-rules.md).

The index pass skims every record (`polar.records.skim_file`) and keeps a few small fields (session, t_start, id, file,
offset, length, plus the bits rule 5 needs as end-of-turn evidence); big values are skipped without being
built. The load pass then reads one session's records back with positioned reads, so memory is bounded by
the largest session (or the null-session group), not the dump.

Files are ordered by name. A torn tail in a `.open` file is "in progress"; in a closed file it is an error that is
reported, never fatal. A record with a newer schema version, or something that is not a record (a whole file of it:
"not a flow file"), is a clear error.
Imports: the standard library and `polar.records` only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from polar import records as rec

# Fields the index keeps. Everything else is skipped by the skim without building objects.
_INDEX_FIELDS = frozenset({"v", "id", "session", "t_start", "model_served", "finish_reason", "stop_reason",
                           "completion_token_ids"})


class InputError(ValueError):
    """Input the processor cannot use (bad schema version, not a flow record): the CLI exits 2."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One record's place in the dump and the few fields the index needs."""

    session: str | None
    t_start: float
    id: str
    file: int  # index into Index.files
    offset: int
    length: int
    model_served: str | None
    finish_reason: str | None
    stop_reason: str | None
    last_completion_id: int | None  # the completion's last token id, when it has one
    has_completion: bool  # completion_token_ids is not nil


@dataclass
class Index:
    """Every record of the dump, grouped by session (None = the null-session group)."""

    files: list[str]
    entries: list[IndexEntry] = field(default_factory=list)
    scans: list[rec.FileScan] = field(default_factory=list)
    total_bytes: int = 0

    def sessions(self) -> dict[str | None, list[IndexEntry]]:
        """Session → its entries in (t_start, id) order (rule 2)."""
        groups: dict[str | None, list[IndexEntry]] = {}
        for e in self.entries:
            groups.setdefault(e.session, []).append(e)
        for entries in groups.values():
            entries.sort(key=lambda e: (e.t_start, e.id))
        return groups

    @property
    def torn_tails(self) -> list[rec.TornTail]:
        return [s.torn_tail for s in self.scans if s.torn_tail is not None]

    @property
    def open_files(self) -> list[str]:
        return [s.path for s in self.scans if s.is_open]


def _check_version(v: object, where: str) -> None:
    problem = rec.version_problem(v)
    if problem is not None:
        raise InputError(f"{where}: {problem}")


def _float(x: object) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else float("nan")


def scan_file(path: str, file_no: int, index: Index) -> None:
    """Index one file: append its entries and its FileScan to `index`. A file that does not start with a flow
    record is an InputError in the record reader's own wording (`polar.records.sniff`), not a torn tail."""
    scan = rec.FileScan(path, is_open=path.endswith(rec.OPEN_SUFFIX))
    try:
        problem = rec.sniff(path)
        size = os.path.getsize(path)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from exc
    if problem is not None:
        raise InputError(problem)
    index.scans.append(scan)
    index.total_bytes += size
    start = 0
    try:
        for at, end, got in rec.skim_file(path, _INDEX_FIELDS, stop=size):
            index.entries.append(_entry(path, file_no, at, end, got))
            scan.records += 1
            start = end
    except rec.Undecodable as exc:
        # Not a record at a record boundary: garbage from here on, reported as a torn tail.
        scan.errors.append(str(exc))
    if start < size:
        scan.torn_tail = rec.TornTail(path, start, size - start, scan.is_open)


def _entry(path: str, file_no: int, start: int, end: int, got: dict) -> IndexEntry:
    """The index entry of the record skimmed at [start, end) of `path`; InputError for a version it cannot read."""
    _check_version(got.get("v"), f"{path} offset {start}")
    comp = got.get("completion_token_ids")
    last = int.from_bytes(comp[-4:], "little", signed=True) if isinstance(comp, bytes) and len(comp) >= 4 else None
    session = got.get("session")
    return IndexEntry(
        session=session if isinstance(session, str) else None,
        t_start=_float(got.get("t_start")),
        id=str(got.get("id") or f"{os.path.basename(path)}@{start}"),
        file=file_no, offset=start, length=end - start,
        model_served=got.get("model_served"), finish_reason=got.get("finish_reason"),
        stop_reason=_text_or_none(got.get("stop_reason")), last_completion_id=last,
        has_completion=isinstance(comp, bytes),
    )


def build_index(inputs: Iterable[str], progress: Callable[[int, int], None] | None = None) -> Index:
    """Pass 1 over every flow file named by `inputs` (directories, globs, paths), ordered by file name."""
    try:
        files = rec.expand_inputs(inputs)
    except FileNotFoundError as exc:
        raise InputError(str(exc)) from exc
    index = Index(files=files)
    total = sum(os.path.getsize(p) for p in files)
    for i, path in enumerate(files):
        scan_file(path, i, index)
        if progress is not None:
            progress(index.total_bytes, total)
    return index


class RecordSource:
    """Reads records back by (file, offset, length) with positioned reads (pass 2).

    pread, not mmap: the bytes of one session are all that is resident, and mapped pages of a large dump never
    count against the process."""

    def __init__(self, files: list[str]):
        self.files = files
        self._records = rec.RecordFiles()

    def read(self, entry: IndexEntry) -> dict:
        """The whole record of `entry`, checked and filled by polar.records.normalize(). OSError when the file
        cannot be read; InputError when its bytes there are not a record this reader can read."""
        try:
            return self._records.read(self.files[entry.file], entry.offset, entry.length)
        except rec.RECORD_ERRORS as exc:
            raise InputError(f"{self.files[entry.file]} offset {entry.offset}: {exc}") from exc

    def load(self, entries: list[IndexEntry]) -> list[tuple[IndexEntry, dict]]:
        """One session's records, in the entries' order. Compact prompts (exact mode's `prompt_ref`) are rebuilt
        here: a referenced record is in the same session and started earlier, so it was read first."""
        resolver = rec.PromptResolver()
        return [(e, resolver.resolve(self.read(e))) for e in entries]

    def close(self) -> None:
        self._records.close()


def _text_or_none(value) -> str | None:
    """vLLM's stop_reason is a matched stop string or a stop token id (int); the index keeps text (Utf8 column)."""
    return None if value is None else str(value)
