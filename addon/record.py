"""The flow record: one msgpack map per model call (DESIGN §5). The only thing the gateway and the processor share.

This module may import only the standard library and msgpack: the processor installs it on Python 3.11 without
mitmproxy. A version bump only adds fields; the reader accepts every older `v` and tolerates unknown fields.

Files: each writer creates its own files, `flows-<UTC %Y%m%dT%H%M%S.%fZ>-<hostname>-<pid>-<seq:04d>.msgpack.open`,
renamed to `.msgpack` on rotation or clean shutdown. A record is one `write`; a failed or short write truncates the
file back and the writer continues in a new file. Readers order files by name; a torn tail in a `.open` file means
"in progress", in a closed file it is an error that is reported, never fatal. A file that does not start with a
record is "not a flow file" (`sniff`): one wording for the inspector and the processor.

Run `python -m polar.addon.record FILE...` to print flow files.
"""

from __future__ import annotations

import array
import datetime as _dt
import glob
import os
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import msgpack

VERSION = 1

PROTOCOLS = ("anthropic_messages", "openai_chat", "openai_responses", "google_generate")
ERROR_STAGES = (
    "agent_input",
    "backend_connect",
    "backend_timeout",
    "backend_status",
    "backend_stream",
    "client_abort",
    "record",
)

# Every field a v1 record carries; readers fill missing ones with None.
FIELDS = (
    "v", "id", "session", "session_source", "conn_id", "protocol", "host", "path", "stream",
    "t_start", "t_first_byte", "t_end", "request", "request_headers", "upstream_request",
    "model_requested", "model_served", "prompt_token_ids", "completion_token_ids", "completion_logprobs",
    "finish_reason", "stop_reason", "usage", "provider_status", "provider_stop_reason", "assistant",
    "sampling", "backend", "weight_versions", "normalizations", "error",
    # exact mode (polar_exact): its per-call report, and the compact prompt form (PromptResolver rebuilds it)
    "exact", "prompt_ref", "prompt_tail_ids",
    # DESIGN §5: tool_choice required/named or a JSON-schema response format (`is_constrained`); nil in older records
    "constrained",
    # DESIGN §10: the policy version current when the request was sent to the backend (the gateway's control state:
    # vLLM's /weight_info at start, then every release); nil when unknown and in older records
    "weight_version",
)

# Headers whose values never reach disk or the backend.
SECRET_HEADERS = frozenset({
    "authorization", "x-api-key", "x-goog-api-key", "cookie", "set-cookie", "proxy-authorization",
    "chatgpt-account-id",
})
REDACTED = "<redacted>"

FILE_SUFFIX = ".msgpack"
OPEN_SUFFIX = ".msgpack.open"


class SchemaError(ValueError):
    """A record this reader cannot understand (a newer schema version, or not a record at all)."""


class NotAFlowFile(SchemaError):
    """A file that does not start with a flow record (see `sniff`); its message is `not_a_flow_file`'s."""


def not_a_flow_file(path: str, why: str) -> str:
    """The one wording, for the inspector and the processor alike, of a file that holds no flow records."""
    return (f"{path}: not a flow file ({why}); pass the gateway's flow directory (polar_flows) or its "
            f"flows-*{FILE_SUFFIX} / *{OPEN_SUFFIX} files")


def version_problem(v: object) -> str | None:
    """Why a record's `v` cannot be read by this reader, or None when it can."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        return f"not a flow record (invalid or missing 'v': {v!r})"
    if v > VERSION:
        return f"record version {v} is newer than this reader ({VERSION}); upgrade polar-gateway"
    return None


# ---------------------------------------------------------------------------------------------------- ids and arrays

def is_constrained(chat_request: dict) -> bool:
    """Whether a chat request constrains decoding: `tool_choice` required or naming a function (with tools to call:
    without any, the choice is not sent), or a JSON-schema response format (a plain `json_object` only asks for JSON). The one rule: the gateway fills the record's
    `constrained` with it, and readers apply it to the `upstream_request` of older records that lack the field."""
    if not isinstance(chat_request, dict):
        return False
    choice = chat_request.get("tool_choice")
    if (choice == "required" or isinstance(choice, dict)) and chat_request.get("tools"):
        return True
    fmt = chat_request.get("response_format")
    return isinstance(fmt, dict) and fmt.get("type") == "json_schema"


def uuid7() -> str:
    """A UUIDv7 string: time-ordered, so record ids sort like their start times."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64 | 0b10 << 62 | (rand & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


def pack_ids(ids: Iterable[int] | None) -> bytes | None:
    """Token ids as int32 little-endian bytes; None stays None (the backend gave none), [] becomes b""."""
    if ids is None:
        return None
    if isinstance(ids, (list, tuple)):
        # struct packs a 12k-id prompt in about half array's time (the largest per-call cost of a record); what it
        # refuses (out of range, not an int) goes on to array, to fail as it always did
        try:
            return struct.pack(f"<{len(ids)}i", *ids)
        except struct.error:
            pass
    arr = array.array("i", ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def unpack_ids(blob: bytes | None) -> list[int] | None:
    if blob is None:
        return None
    arr = array.array("i")
    arr.frombytes(blob)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


def pack_floats(values: Iterable[float] | None) -> bytes | None:
    """Logprobs as float32 little-endian bytes."""
    if values is None:
        return None
    arr = array.array("f", values)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def unpack_floats(blob: bytes | None) -> list[float] | None:
    if blob is None:
        return None
    arr = array.array("f")
    arr.frombytes(blob)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


def redact_headers(headers: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Header pairs with every secret value replaced by "<redacted>"."""
    return [[k, REDACTED if k.lower() in SECRET_HEADERS else v] for k, v in headers]


# ---------------------------------------------------------------------------------------------------- pack / unpack

def new_record(**values) -> dict:
    """A record with every field of FIELDS (None unless given, `normalizations` an empty list); ValueError on a name
    that is not a field."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"not record fields: {sorted(unknown)}")
    record = dict.fromkeys(FIELDS)
    record.update(v=VERSION, normalizations=[])
    record.update(values)
    return record


def validate(record: dict) -> None:
    """The invariants a writer keeps; ValueError names the first one broken: only known fields; token arrays are
    int32/float32 blobs; one logprob per sampled token (`completion_logprobs` is nil or exactly as long as
    `completion_token_ids`); an error's stage is one of ERROR_STAGES; `weight_version` is a string or nil."""
    unknown = set(record) - set(FIELDS)
    if unknown:
        raise ValueError(f"not record fields: {sorted(unknown)}")
    for name in ("prompt_token_ids", "completion_token_ids", "completion_logprobs", "prompt_tail_ids"):
        blob = record.get(name)
        if blob is not None and (not isinstance(blob, (bytes, bytearray)) or len(blob) % 4):
            raise ValueError(f"{name} must be a blob of 4-byte values")
    logprobs, completion = record.get("completion_logprobs"), record.get("completion_token_ids")
    if logprobs is not None and (completion is None or len(logprobs) != len(completion)):
        raise ValueError("completion_logprobs must hold one logprob per completion token")
    if not isinstance(record.get("weight_version"), (str, type(None))):
        raise ValueError("weight_version must be a string or nil")
    error = record.get("error")
    if error is not None and error.get("stage") not in ERROR_STAGES:
        raise ValueError(f"error stage {error.get('stage')!r} is not one of {ERROR_STAGES}")


def pack(record: dict) -> bytes:
    return msgpack.packb(record, use_bin_type=True)


def normalize(record: dict) -> dict:
    """Check the version and fill fields an older writer did not know. Unknown fields are kept as they are."""
    if not isinstance(record, dict):
        raise SchemaError(f"not a flow record (a msgpack {type(record).__name__}, not a map)")
    problem = version_problem(record.get("v"))
    if problem is not None:
        raise SchemaError(problem)
    for name in FIELDS:
        record.setdefault(name, None)
    return record


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


def _is_map_head(byte: int) -> bool:
    """msgpack fixmap, map16 or map32: the only way a record can start."""
    return 0x80 <= byte <= 0x8F or byte in (0xDE, 0xDF)


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
        unpacker = msgpack.Unpacker(fh, raw=False, strict_map_key=False, read_size=1 << 16,
                                    max_buffer_size=1 << 31)
        try:
            for _ in range(unpacker.read_map_header()):
                if unpacker.unpack() != "v":
                    unpacker.skip()
                    continue
                v = unpacker.unpack()
                if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
                    return None
                return not_a_flow_file(path, f"its first map's 'v' is {v!r}, not a record version")
        except msgpack.OutOfData:
            return None
        except (msgpack.FormatError, msgpack.StackError, ValueError) as exc:
            return not_a_flow_file(path, f"undecodable at offset 0: {exc}")
    return not_a_flow_file(path, "its first map has no 'v' field")


def iter_file(path: str, scan: FileScan | None = None, raw: bool = False,
              resolver: "PromptResolver | None" = None) -> Iterator[tuple[int, dict]]:
    """Yield (offset, record) for every whole record in `path`. A torn tail is reported in `scan`, never raised;
    a file that does not start with a record raises NotAFlowFile (`sniff`).

    Compact prompts (`prompt_ref`) are rebuilt from records earlier in the file, or earlier in any file that went
    through the same `resolver` (see `iter_files`). raw=True skips normalize() and this rebuilding (for index
    passes that only read a few fields)."""
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
            scan.errors.append(f"{path}: undecodable bytes at offset {offset}: {exc}")
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


def read_at(path: str, offset: int) -> dict:
    """The one record that starts at `offset` in `path`."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        unpacker = msgpack.Unpacker(fh, raw=False, strict_map_key=False, max_buffer_size=1 << 31)
        return normalize(unpacker.unpack())


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
    """Rebuilds `prompt_token_ids` of records written in DESIGN §5's compact form: `prompt_ref` {id, len} +
    `prompt_tail_ids` means the referenced record's prompt + completion cut to `len`, then the tail.

    Feed records in file order (a referenced record is always older: same session, earlier start): `resolve(r)`
    fills r["prompt_token_ids"] when the referenced record was seen, then remembers r. Memory is bounded by
    `max_bytes` of remembered ids (oldest forgotten first); an unresolvable record keeps `prompt_token_ids` nil and
    is counted in `unresolved` (the processor then leaves it out of sequences, DESIGN §6 rule 1)."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._seen: dict[str, tuple[bytes, bytes]] = {}
        self._bytes = 0
        self.unresolved: list[str] = []

    def resolve(self, record: dict) -> dict:
        ref = record.get("prompt_ref")
        if record.get("prompt_token_ids") is None and isinstance(ref, dict):
            parent = self._seen.get(str(ref.get("id")))
            cut = ref.get("len")
            tail = record.get("prompt_tail_ids")
            if parent is not None and isinstance(cut, int) and isinstance(tail, bytes) \
                    and 0 <= cut <= (len(parent[0]) + len(parent[1])) // 4:
                record["prompt_token_ids"] = (parent[0] + parent[1])[: 4 * cut] + tail
            else:
                self.unresolved.append(str(record.get("id")))
        self.remember(record)
        return record

    def remember(self, record: dict) -> None:
        prompt, completion = record.get("prompt_token_ids"), record.get("completion_token_ids")
        rid = record.get("id")
        if not isinstance(prompt, bytes) or not isinstance(rid, str):
            return
        completion = completion if isinstance(completion, bytes) else b""
        old = self._seen.pop(rid, None)
        if old is not None:
            self._bytes -= len(old[0]) + len(old[1])
        self._seen[rid] = (prompt, completion)
        self._bytes += len(prompt) + len(completion)
        while self._bytes > self.max_bytes and len(self._seen) > 1:
            first = next(iter(self._seen))
            p, c = self._seen.pop(first)
            self._bytes -= len(p) + len(c)


def iter_files(paths: Iterable[str], scans: list[FileScan] | None = None) -> Iterator[tuple[str, int, dict]]:
    """Yield (path, offset, record) over several files in order, rebuilding compact prompts across files."""
    resolver = PromptResolver()
    for path in paths:
        scan = FileScan(path)
        if scans is not None:
            scans.append(scan)
        for offset, record in iter_file(path, scan, resolver=resolver):
            yield path, offset, record


def token_ids(record: dict, name: str) -> list[int] | None:
    """A token-id field as a list ("prompt_token_ids" or "completion_token_ids")."""
    return unpack_ids(record.get(name))


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
        self._host = socket.gethostname().replace("-", "_").replace("/", "_") or "host"
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
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        while True:
            self._seq += 1
            name = f"flows-{stamp}-{self._host}-{os.getpid()}-{self._seq:04d}{OPEN_SUFFIX}"
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
        os.replace(self._path, self._path[: -len(".open")])
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


# ---------------------------------------------------------------------------------------------------- inspector

# Binary fields that hold int32 token ids (printed as ids, never as bytes).
ID_FIELDS = ("prompt_token_ids", "completion_token_ids", "prompt_tail_ids")


def _summary(record: dict) -> dict:
    out = {}
    for key, value in record.items():
        if key in ID_FIELDS and isinstance(value, bytes):
            ids = unpack_ids(value)
            out[key] = f"{len(ids)} ids: {ids[:8]}{'…' if len(ids) > 8 else ''}"
        elif key == "completion_logprobs" and isinstance(value, bytes):
            lps = unpack_floats(value)
            out[key] = f"{len(lps)} logprobs: {[round(x, 3) for x in lps[:4]]}{'…' if len(lps) > 4 else ''}"
        elif isinstance(value, bytes):
            out[key] = f"<{len(value)} bytes> {value[:120].decode('utf-8', 'replace')}{'…' if len(value) > 120 else ''}"
        else:
            out[key] = value
    return out


def _full(record: dict) -> dict:
    return {k: (unpack_ids(v) if k in ID_FIELDS and isinstance(v, bytes)
                else unpack_floats(v) if k == "completion_logprobs" and isinstance(v, bytes)
                else v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
            for k, v in record.items()}


def main(argv: list[str] | None = None) -> int:
    """Print flow files. Exit codes: 0 ok, 2 bad input (a path that is not there, a file that is not a flow file,
    a record this reader cannot read); every error is one line on stderr."""
    import argparse
    import json

    prog = "python -m polar.addon.record"
    parser = argparse.ArgumentParser(prog=prog, description="Print flow records.")
    parser.add_argument("paths", nargs="+", help="flow files, directories or globs")
    parser.add_argument("--full", action="store_true", help="print whole bodies and token arrays")
    args = parser.parse_args(argv)
    err = lambda msg: print(f"{prog}: error: {msg}", file=sys.stderr) or 2  # noqa: E731
    try:
        paths = expand_inputs(args.paths)
    except FileNotFoundError as exc:
        return err(f"{exc}; pass flow files, directories or globs that exist")
    if not paths:
        return err(f"no flow files (*{FILE_SUFFIX}, *{OPEN_SUFFIX}) in {' '.join(args.paths)}")
    status = 0
    for path in paths:
        scan = FileScan(path)
        print(f"# {path}")
        try:
            for offset, rec in iter_file(path, scan):
                if args.full:
                    print(json.dumps({"offset": offset, **_full(rec)}, ensure_ascii=False, default=str))
                else:
                    print(json.dumps({"offset": offset, **_summary(rec)}, ensure_ascii=False, default=str, indent=1))
        except NotAFlowFile as exc:
            status = err(str(exc))
            continue
        except SchemaError as exc:
            status = err(f"{path}: {exc}")
        except OSError as exc:
            status = err(f"{path}: {exc.strerror or exc}")
            continue
        if scan.torn_tail:
            print(f"# {scan.torn_tail.describe()}", file=sys.stderr)
        print(f"# {scan.records} records")
    return status


if __name__ == "__main__":
    sys.exit(main())
