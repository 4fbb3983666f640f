"""The flow directory: the files writers append records to, and every way of reading them back.

What a writer guarantees:
- Each writer creates its own files, named `flows-<UTC %Y%m%dT%H%M%S.%fZ>-<host>-<pid>-<seq:04d>.msgpack.open`
  (`WriterName`; the host name with `-` and `/` replaced by `_`), and renames a file to `.msgpack` on rotation or
  clean shutdown. A closed file never changes again.
- A record is one `write`: a failed or short write truncates the file back and the writer continues in a new file,
  so a torn record can only exist at the end of a file while a write is in flight, or after a crash.

What a reader tolerates:
- Files are ordered by name: one writer's files sort in the order it wrote them.
- A torn tail in a `.open` file means "in progress"; in a closed file it is an error that is reported, never fatal.
- A file that does not start with a record is "not a flow file" (`sniff`): one wording for every reader.
- A `.open` file whose writer died stays `.open` until `close_dead_writers` cuts it back to its last whole record
  and closes it.

Three ways to read: whole records in file order (`iter_file`, `iter_files`, with compact prompts rebuilt by
`PromptResolver`); a skim that builds only a few small top-level fields of each record and skips the rest unbuilt
(`skim`, `skim_file`: index passes); and positioned reads of one record at a known offset (`read_at`, `record_at`,
`RecordFiles`).

This module imports only the standard library, msgpack and `schema`.
"""

from __future__ import annotations

import datetime as _dt
import glob
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import msgpack

from . import schema
from .schema import SchemaError, normalize, pack

FILE_SUFFIX = ".msgpack"
OPEN_SUFFIX = ".msgpack.open"

# What reading one record's bytes may raise besides OSError: bytes that are not msgpack, or not a record this
# reader can read (SchemaError is a ValueError).
RECORD_ERRORS = (ValueError, msgpack.UnpackException)


# ---------------------------------------------------------------------------------------------------- file names

def local_host() -> str:
    """This host's name as writers put it in their file names: `-` and `/` replaced by `_`."""
    return socket.gethostname().replace("-", "_").replace("/", "_") or "host"


def is_open_name(name: str) -> bool:
    """Whether a file name (or path) is a flow file still being written (its writer has not closed it)."""
    return name.endswith(OPEN_SUFFIX)


def closed_name(name: str) -> str:
    """The name (or path) a `.open` flow file gets when its writer closes it."""
    return name[: -len(".open")]


def flow_stem(name: str) -> str | None:
    """A flow file's name without its suffix (`.msgpack` or `.msgpack.open`), the same before and after it is
    closed; None for a name that is not a flow file's."""
    for suffix in (OPEN_SUFFIX, FILE_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


_WRITER_NAME = re.compile(r"^flows-(?P<stamp>[^-]+)-(?P<host>[^-]+)-(?P<pid>\d+)-(?P<seq>\d+)$")


@dataclass(frozen=True)
class WriterName:
    """The name of a file one writer created: its start time, host, pid and sequence number."""

    stamp: str   # UTC %Y%m%dT%H%M%S.%fZ when the writer opened the file
    host: str    # `local_host()` of the writer
    pid: int
    seq: int     # 1, 2, … per writer

    @property
    def stem(self) -> str:
        return f"flows-{self.stamp}-{self.host}-{self.pid}-{self.seq:04d}"

    @property
    def writer(self) -> str:
        """`host-pid`: the files of one writer share it."""
        return f"{self.host}-{self.pid}"

    def format(self, suffix: str = OPEN_SUFFIX) -> str:
        """The file name: `.msgpack.open` while written, `.msgpack` (suffix=FILE_SUFFIX) once closed."""
        return self.stem + suffix

    @classmethod
    def parse(cls, name: str) -> WriterName | None:
        """The parts of a writer's file name (with either suffix, or none); None for a name of another shape."""
        m = _WRITER_NAME.match(flow_stem(name) or name)
        if m is None:
            return None
        return cls(m["stamp"], m["host"], int(m["pid"]), int(m["seq"]))


def writer_stamp() -> str:
    """The start-time part of a new file's name: now, in UTC."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


# ---------------------------------------------------------------------------------------------------- not a flow file

class NotAFlowFile(SchemaError):
    """A file that does not start with a flow record (see `sniff`); its message is `not_a_flow_file`'s."""


def not_a_flow_file(path: str, why: str) -> str:
    """The one wording, for the inspector and the processor alike, of a file that holds no flow records."""
    return (f"{path}: not a flow file ({why}); pass the gateway's flow directory (polar_flows) or its "
            f"flows-*{FILE_SUFFIX} / *{OPEN_SUFFIX} files")


class Undecodable(ValueError):
    """Bytes at a record boundary that are not a record; `offset` is where they start."""

    def __init__(self, path: str, offset: int, why: object):
        super().__init__(f"{path}: undecodable bytes at offset {offset}: {why}")
        self.path, self.offset = path, offset


_SKIM_ERRORS = (msgpack.FormatError, msgpack.StackError, ValueError, TypeError)


def _is_map_head(byte: int) -> bool:
    """msgpack fixmap, map16 or map32: the only way a record can start."""
    return 0x80 <= byte <= 0x8F or byte in (0xDE, 0xDF)


def _unpacker(fh=None, read_size: int = 1 << 20) -> msgpack.Unpacker:
    if fh is None:
        return msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=1 << 31)
    return msgpack.Unpacker(fh, raw=False, strict_map_key=False, read_size=read_size, max_buffer_size=1 << 31)


def sniff(path: str) -> str | None:
    """Why `path` is not a flow file, in `not_a_flow_file`'s wording; None when it is one.

    A flow file is empty or starts with a msgpack map whose `v` is a record version. Only the first record is
    looked at (its other values are skipped unbuilt): a torn first record is a torn tail, not a foreign file, and a
    newer `v` is the reader's "upgrade" error. Raises OSError when the file cannot be read."""
    with open(path, "rb") as fh:
        head = fh.read(1)
        if not head:
            return None
        if not _is_map_head(head[0]):
            return not_a_flow_file(path, f"it starts with byte 0x{head[0]:02x}, not a msgpack map")
        fh.seek(0)
        try:
            got = skim(_unpacker(fh, read_size=1 << 16), frozenset({"v"}), until_found=True)
        except msgpack.OutOfData:
            return None
        except (msgpack.FormatError, msgpack.StackError, ValueError) as exc:
            return not_a_flow_file(path, f"undecodable at offset 0: {exc}")
    if "v" not in got:
        return not_a_flow_file(path, "its first map has no 'v' field")
    v = got["v"]
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
        return None
    return not_a_flow_file(path, f"its first map's 'v' is {v!r}, not a record version")


# ---------------------------------------------------------------------------------------------------- the skim

def skim(unpacker: msgpack.Unpacker, wanted: frozenset, *, until_found: bool = False) -> dict:
    """The `wanted` top-level values of the record at the unpacker's position; every other value (and every key
    that is not a string) is skipped without being built, so a skim costs the record's bytes, not its objects.

    Leaves the unpacker at the next record, or, with `until_found`, returns as soon as every wanted key was read
    (the unpacker is then inside the record: for a first look only). Raises msgpack.OutOfData at a torn tail and
    msgpack's errors (ValueError and kin) at bytes that are not a record."""
    got: dict = {}
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if isinstance(key, str) and key in wanted:
            got[key] = unpacker.unpack()
            if until_found and len(got) == len(wanted):
                return got
        else:
            unpacker.skip()
    return got


def skim_file(path: str, wanted: frozenset, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int, dict]]:
    """(start, end, fields) of each whole record of `path` from byte `start` (a record boundary) on, skimmed
    (`skim`). Ends quietly at a torn tail (compare the last `end` with the file's size) and, given `stop`, before
    the first record that starts at or after it (a file still growing). Bytes at a record boundary that are not a
    record raise Undecodable; OSError when the file cannot be read."""
    with open(path, "rb") as fh:
        fh.seek(start)
        base = start
        unpacker = _unpacker(fh)
        while stop is None or start < stop:
            try:
                got = skim(unpacker, wanted)
            except msgpack.OutOfData:
                return
            except _SKIM_ERRORS as exc:
                raise Undecodable(path, start, exc) from exc
            end = base + unpacker.tell()
            yield start, end, got
            start = end


# ---------------------------------------------------------------------------------------------------- whole records

@dataclass(frozen=True)
class TornTail:
    """Bytes at the end of a file that do not form a whole record."""

    file: str
    offset: int
    nbytes: int
    in_progress: bool  # True in a `.open` file: a writer may still be appending

    def describe(self) -> str:
        state = "in progress" if self.in_progress else "ERROR: torn tail in a closed file"
        return f"{self.file}: {self.nbytes} bytes at offset {self.offset} do not form a record ({state})"


@dataclass
class FileScan:
    """What reading one flow file found."""

    path: str
    records: int = 0
    torn_tail: TornTail | None = None
    is_open: bool = False
    errors: list[str] = field(default_factory=list)


def iter_file(path: str, scan: FileScan | None = None, raw: bool = False,
              resolver: PromptResolver | None = None) -> Iterator[tuple[int, dict]]:
    """Yield (offset, record) for every whole record in `path`. A torn tail is reported in `scan`, never raised;
    a file that does not start with a record raises NotAFlowFile (`sniff`).

    Compact prompts (`prompt_ref`) are rebuilt from records earlier in the file, or earlier in any file that went
    through the same `resolver` (see `iter_files`). raw=True skips normalize() and this rebuilding (for passes
    that only read a few fields)."""
    if resolver is None and not raw:
        resolver = PromptResolver()
    scan = scan if scan is not None else FileScan(path)
    scan.is_open = path.endswith(".open")
    problem = sniff(path)
    if problem is not None:
        raise NotAFlowFile(problem)
    with open(path, "rb") as fh:
        data = fh.read()
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1 << 20))
    unpacker.feed(data)
    offset = 0
    while True:
        try:
            obj = unpacker.unpack()
        except msgpack.OutOfData:
            break
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
            scan.errors.append(str(Undecodable(path, offset, exc)))
            scan.torn_tail = TornTail(path, offset, len(data) - offset, scan.is_open)
            return
        end = unpacker.tell()
        if not raw:
            try:
                obj = resolver.resolve(normalize(obj))
            except SchemaError as exc:
                raise SchemaError(f"offset {offset}: {exc}") from exc
        scan.records += 1
        yield offset, obj
        offset = end
    if offset < len(data):
        scan.torn_tail = TornTail(path, offset, len(data) - offset, scan.is_open)


def iter_files(paths: Iterable[str], scans: list[FileScan] | None = None) -> Iterator[tuple[str, int, dict]]:
    """Yield (path, offset, record) over several files in order, rebuilding compact prompts across files."""
    resolver = PromptResolver()
    for path in paths:
        scan = FileScan(path)
        if scans is not None:
            scans.append(scan)
        for offset, record in iter_file(path, scan, resolver=resolver):
            yield path, offset, record


def expand_inputs(inputs: Iterable[str]) -> list[str]:
    """Flow files named by directories, globs or paths, ordered by file name (the writer's start time)."""
    found: set[str] = set()
    for item in inputs:
        if os.path.isdir(item):
            for name in os.listdir(item):
                if name.endswith(FILE_SUFFIX) or name.endswith(OPEN_SUFFIX):
                    found.add(os.path.join(item, name))
        elif any(ch in item for ch in "*?["):
            found.update(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
        elif os.path.isfile(item):
            found.add(item)
        else:
            raise FileNotFoundError(f"no such flow file or directory: {item}")
    return sorted(found, key=lambda p: (os.path.basename(p), p))


class PromptResolver:
    """Rebuilds `prompt_token_ids` of records written in the compact form: `prompt_ref` {id, len} +
    `prompt_tail_ids` means the referenced record's prompt + completion cut to `len`, then the tail.

    Feed records in file order (a referenced record is always older: same session, earlier start): `resolve(r)`
    fills r["prompt_token_ids"] (int32 bytes, whatever the parent's and the tail's encodings) when the referenced
    record was seen, then remembers r. A remembered prompt stays in its encoding until a child needs it. Memory is
    bounded by `max_bytes` of remembered ids (oldest forgotten first); an unresolvable record keeps
    `prompt_token_ids` nil and is counted in `unresolved` (the processor then leaves it out of sequences)."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._seen: dict[str, tuple[bytes | msgpack.ExtType, bytes]] = {}
        self._bytes = 0
        self.unresolved: list[str] = []

    def resolve(self, record: dict) -> dict:
        ref = record.get("prompt_ref")
        if record.get("prompt_token_ids") is None and isinstance(ref, dict):
            parent = self._seen.get(str(ref.get("id")))
            cut = ref.get("len")
            try:
                tail = schema.ids_blob(record.get("prompt_tail_ids"))
                head = self._decoded(str(ref.get("id")), parent) + parent[1] if parent is not None else None
            except ValueError:
                tail = head = None  # undecodable ids: unresolved, never guessed
            if head is not None and isinstance(cut, int) and isinstance(tail, bytes) and 0 <= cut <= len(head) // 4:
                record["prompt_token_ids"] = head[: 4 * cut] + tail
            else:
                self.unresolved.append(str(record.get("id")))
        self.remember(record)
        return record

    def _decoded(self, rid: str, parent: tuple) -> bytes:
        """The parent's prompt as int32 bytes, decoded once and kept so (its other children need it too)."""
        prompt = parent[0]
        if isinstance(prompt, msgpack.ExtType):
            prompt = schema.ids_blob(prompt)
            self._bytes += len(prompt) - _size(parent[0])
            self._seen[rid] = (prompt, parent[1])
        return prompt

    def remember(self, record: dict) -> None:
        prompt, completion = record.get("prompt_token_ids"), record.get("completion_token_ids")
        rid = record.get("id")
        if not schema.is_ids(prompt) or not isinstance(rid, str):
            return
        completion = completion if isinstance(completion, bytes) else b""
        old = self._seen.pop(rid, None)
        if old is not None:
            self._bytes -= _size(old[0]) + len(old[1])
        self._seen[rid] = (prompt, completion)
        self._bytes += _size(prompt) + len(completion)
        while self._bytes > self.max_bytes and len(self._seen) > 1:
            first = next(iter(self._seen))
            p, c = self._seen.pop(first)
            self._bytes -= _size(p) + len(c)


def _size(ids: bytes | msgpack.ExtType) -> int:
    return len(ids.data) if isinstance(ids, msgpack.ExtType) else len(ids)


# ---------------------------------------------------------------------------------------------------- positioned reads

def record_at(fd: int, offset: int, length: int | None = None) -> dict:
    """The one record that starts at `offset` of the open file `fd`, checked and filled (`normalize`). With its
    `length` (from an index pass) exactly those bytes are read; without, the file is read from `offset` until the
    record is whole. Raises OSError, or one of RECORD_ERRORS (msgpack.OutOfData when the file ends first)."""
    if length is not None:
        return normalize(msgpack.unpackb(os.pread(fd, length, offset), raw=False, strict_map_key=False))
    unpacker = _unpacker()
    while True:
        chunk = os.pread(fd, 1 << 16, offset)
        if not chunk:
            raise msgpack.OutOfData()
        unpacker.feed(chunk)
        offset += len(chunk)
        try:
            obj = unpacker.unpack()
        except msgpack.OutOfData:
            continue
        return normalize(obj)


def read_at(path: str, offset: int, length: int | None = None) -> dict:
    """The one record that starts at `offset` in `path` (see `record_at`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return record_at(fd, offset, length)
    finally:
        os.close(fd)


class RecordFiles:
    """Positioned reads over many flow files, each opened once: pread, not mmap, so only the bytes of the records
    asked for are read and no mapped page of a large dump counts against the process. Not thread-safe."""

    def __init__(self):
        self._fds: dict[str, int] = {}

    def read(self, path: str, offset: int, length: int | None = None) -> dict:
        """The record at `offset` of `path` (see `record_at`)."""
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        return record_at(fd, offset, length)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> RecordFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------- dead writers

def _cut_to_last_record(path: str) -> None:
    """Truncate `path` after its last whole record (to nothing when it holds none) when it ends in a torn tail.
    Raises OSError, or SchemaError for a file that is not a flow file."""
    scan = FileScan(path)
    end = 0
    for offset, _ in iter_file(path, scan, raw=True):
        end = offset
    if scan.records:
        # the end of the last whole record: the torn tail (if any) starts there
        end = scan.torn_tail.offset if scan.torn_tail is not None else os.path.getsize(path)
    if scan.torn_tail is not None:
        os.truncate(path, end if scan.records else 0)


def close_dead_writers(directory: str, alive: Callable[[int], bool], host: str | None = None) -> list[str]:
    """Close the `.open` files of this host's writers that are gone: each file whose writer's pid is not `alive`
    is cut back to its last whole record and renamed to `.msgpack`, as its writer would have at shutdown. Files of
    other hosts (`host`, default `local_host()`), of live writers, and files that cannot be read or are not flow
    files are left as they are. Returns the names of the files it closed (their `.open` names), in name order."""
    host = local_host() if host is None else host
    closed: list[str] = []
    if not os.path.isdir(directory):
        return closed
    for name in sorted(os.listdir(directory)):
        w = WriterName.parse(name)
        if w is None or not is_open_name(name) or w.host != host or alive(w.pid):
            continue
        path = os.path.join(directory, name)
        try:
            _cut_to_last_record(path)
        except (OSError, SchemaError):
            continue
        os.replace(path, closed_name(path))
        closed.append(name)
    return closed


# ---------------------------------------------------------------------------------------------------- writer

class LowDiskSpace(RuntimeError):
    """Free space in the flow directory is below polar_min_free_mb: generation must not start."""


class FlowWriter:
    """Appends records to files this process created; one `os.write` per record.

    Thread-safe. A short or failed write truncates the file back to its previous size, closes it and continues in a
    new file, so a torn record can only exist while a write is in flight (a crash loses at most that record)."""

    def __init__(self, directory: str, rotate_mb: float = 256, min_free_mb: float = 512, fsync: bool = False):
        self.directory = directory
        self.rotate_bytes = int(rotate_mb * 1024 * 1024)
        self.min_free_bytes = int(min_free_mb * 1024 * 1024)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._path: str | None = None
        self._size = 0
        self._seq = 0
        self._host = local_host()
        os.makedirs(directory, exist_ok=True)

    @property
    def current_path(self) -> str | None:
        return self._path

    def free_bytes(self) -> int:
        st = os.statvfs(self.directory)
        return st.f_bavail * st.f_frsize

    def check_space(self) -> None:
        """Raise LowDiskSpace when a new generation could not be recorded safely."""
        if self.min_free_bytes > 0 and self.free_bytes() < self.min_free_bytes:
            raise LowDiskSpace(
                f"flow directory {self.directory} has less than {self.min_free_bytes // (1024 * 1024)} MB free"
            )

    def _open_new(self) -> None:
        stamp = writer_stamp()
        while True:
            self._seq += 1
            name = WriterName(stamp, self._host, os.getpid(), self._seq).format()
            path = os.path.join(self.directory, name)
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except FileExistsError:
                continue
            self._path = path
            self._size = 0
            return

    def _close_current(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)
        assert self._path is not None
        os.replace(self._path, closed_name(self._path))
        self._fd = None
        self._path = None
        self._size = 0

    def write(self, record: dict) -> str:
        """Write one record; returns the file it landed in. Raises OSError when it could not be written whole."""
        blob = pack(record)
        with self._lock:
            if self._fd is None:
                self._open_new()
            assert self._fd is not None and self._path is not None
            start = self._size
            path = self._path
            try:
                n = os.write(self._fd, blob)
                if n != len(blob):
                    raise OSError(f"short write: {n} of {len(blob)} bytes")
                if self.fsync:
                    os.fsync(self._fd)
            except OSError:
                # Leave no torn record behind in a file we keep: cut it back, close it, continue in a new file.
                try:
                    os.ftruncate(self._fd, start)
                finally:
                    self._close_current()
                raise
            self._size += n
            if self._size >= self.rotate_bytes:
                self._close_current()
            return path

    def close(self) -> None:
        with self._lock:
            self._close_current()
