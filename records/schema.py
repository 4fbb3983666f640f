"""The flow record: one msgpack map per model call, the only thing the gateway and its readers share.

What a writer guarantees: every record is a map with every field of FIELDS (`new_record`), keeps the invariants of
`validate`, and carries `v` = VERSION. A version bump only adds fields. What a reader tolerates: every older `v`
(the fields it lacks read as None) and fields it does not know (kept as they are); a newer `v` is a clear error
(`SchemaError`), never a guess.

Token ids are int32 and logprobs float32, little-endian blobs (`pack_ids`, `pack_floats`). Since v3 a prompt's ids
may instead be the backend's own ASCII digits, comma-separated, in a msgpack ExtType (code ASCII_IDS, `ascii_ids`):
the gateway stores vLLM's `prompt_token_ids` array as it came, never turning 12k ids into Python ints. Plain bin is
never used for it, so a reader that does not know the encoding fails loudly instead of reading digits as int32.
Every reader goes through `ids_blob` / `unpack_ids` / `id_count`, which take either encoding. Record ids are UUIDv7
(`uuid7`): time-ordered, so ids sort like start times. Header values named in SECRET_HEADERS never reach a record.

This module imports only the standard library and msgpack.
"""

from __future__ import annotations

import array
import os
import struct
import sys
import time
import uuid
from collections.abc import Iterable

import msgpack

from polar.records import protocols

VERSION = 4
# A weight_version's most characters: the gateway's control endpoint and polar-vllm reload refuse longer ones.
MAX_VERSION_CHARS = 256

# the fields that may hold ASCII ids (the prompt: the one array the gateway only stores)
ASCII_ID_FIELDS = ("prompt_token_ids", "prompt_tail_ids")
# msgpack ExtType code of token ids as ASCII decimal digits joined by commas (b"1,22,333"; b"" is no id)
ASCII_IDS = 1

PROTOCOLS = protocols.PROTOCOLS  # its home is polar.records.protocols (the SDK agent reads it in a sandbox)
ERROR_STAGES = (
    "agent_input",
    "backend_connect",
    "backend_timeout",
    "backend_status",
    "backend_stream",
    "client_abort",
    "record",
)

# Every field a record of this version carries; readers fill missing ones with None.
FIELDS = (
    "v", "id", "session", "session_source", "conn_id", "protocol", "host", "path", "stream",
    "t_start", "t_first_byte", "t_end", "request", "request_headers", "upstream_request",
    "model_requested", "model_served", "prompt_token_ids", "completion_token_ids", "completion_logprobs",
    "finish_reason", "stop_reason", "usage", "provider_status", "provider_stop_reason", "assistant",
    "sampling", "backend", "weight_versions", "normalizations", "error",
    # exact mode (polar_exact): its per-call report, and the compact prompt form (PromptResolver rebuilds it)
    "exact", "prompt_ref", "prompt_tail_ids",
    # tool_choice required/named or a JSON-schema response format (`is_constrained`); nil in older records
    "constrained",
    # the policy version current when the request was sent to the backend (the gateway's control state: vLLM's
    # /weight_info at start, then every release); nil when unknown and in older records
    "weight_version",
    # v2: how the agent reached the gateway — "proxy" (HTTPS_PROXY, the transparent path) or "base_url" (its provider
    # base URL set to the gateway); nil in older records, which all came through the proxy
    "connect",
    # v3 adds no field: prompt_token_ids and prompt_tail_ids may be ASCII ids (ASCII_IDS)
    # v4, the replica pool: the base URL of the replica that served the call; every replica tried, in order, when a
    # failure before the first byte moved the call (else nil); the hash of the serving backend's render of a fixed
    # conversation (which chat template and tokenizer made the prompt); nil in older records
    "replica", "replicas_tried", "template_hash",
)

# Headers whose values never reach disk or the backend.
SECRET_HEADERS = frozenset({
    "authorization", "x-api-key", "x-goog-api-key", "cookie", "set-cookie", "proxy-authorization",
    "chatgpt-account-id",
})
REDACTED = "<redacted>"


class SchemaError(ValueError):
    """A record this reader cannot understand (a newer schema version, or not a record at all)."""


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
    without any, the choice is not sent), or a JSON-schema response format (a plain `json_object` only asks for
    JSON). The one rule: the gateway fills the record's `constrained` with it, and readers apply it to the
    `upstream_request` of older records that lack the field."""
    if not isinstance(chat_request, dict):
        return False
    choice = chat_request.get("tool_choice")
    if (choice == "required" or isinstance(choice, dict)) and chat_request.get("tools"):
        return True
    fmt = chat_request.get("response_format")
    return isinstance(fmt, dict) and fmt.get("type") == "json_schema"


def uuid7() -> str:
    """A UUIDv7 string: time-ordered, so record ids sort like their start times. The project's one UUIDv7: record
    ids, run ids and session ids all come from here."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = ((ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64 | 0b10 << 62
             | (rand & ((1 << 62) - 1)))
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


def ascii_ids(digits: bytes) -> msgpack.ExtType:
    """Token ids kept as the backend wrote them: ASCII decimal digits joined by commas, no brackets, no spaces
    (b"" for no id). The caller has checked the form (`is_ascii_ids`)."""
    return msgpack.ExtType(ASCII_IDS, bytes(digits))


_ID_CHARS = b"0123456789,"


def is_ascii_ids(digits: bytes) -> bool:
    """Whether `digits` has the ASCII_IDS form: empty, or decimal numbers joined by single commas. C-speed scans
    only: the gateway checks every prompt with it before storing the bytes. (An id past int32 passes here and is
    refused where the digits are decoded: never read as a wrong id.)"""
    if not digits:
        return True
    return not (digits.translate(None, _ID_CHARS) or digits[:1] == b"," or digits[-1:] == b","
                or b",," in digits)


def _ascii_to_array(digits: bytes) -> array.array:
    arr = array.array("i")
    if digits:
        if not is_ascii_ids(digits):
            raise ValueError("ASCII token ids hold something other than digits and single commas")
        try:
            arr.extend(map(int, digits.split(b",")))
        except OverflowError:
            raise ValueError("an ASCII token id is past int32") from None
    return arr


def ids_blob(value: bytes | msgpack.ExtType | None) -> bytes | None:
    """A token-id field of either encoding as int32 little-endian bytes; None stays None. ValueError on an ExtType
    that is not ASCII_IDS or whose digits are not ids."""
    if value is None or isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, msgpack.ExtType) and value.code == ASCII_IDS:
        arr = _ascii_to_array(value.data)  # array("i") refuses an id past int32 (OverflowError → ValueError)
        if sys.byteorder != "little":
            arr.byteswap()
        return arr.tobytes()
    raise ValueError(f"not a token-id field: {type(value).__name__}")


def is_ids(value) -> bool:
    """Whether a record field holds token ids in either encoding (int32 bytes, or an ASCII_IDS ext): what a reader
    checks before it counts or decodes them."""
    return isinstance(value, (bytes, bytearray)) or (isinstance(value, msgpack.ExtType) and value.code == ASCII_IDS)


def id_count(value: bytes | msgpack.ExtType | None) -> int | None:
    """How many ids a token-id field of either encoding holds, without decoding them."""
    if value is None:
        return None
    if isinstance(value, msgpack.ExtType):
        return value.data.count(b",") + 1 if value.data else 0
    return len(value) // 4


def unpack_ids(blob: bytes | msgpack.ExtType | None) -> list[int] | None:
    """Token ids back from either encoding (int32 little-endian bytes, or ASCII_IDS); None stays None."""
    if blob is None:
        return None
    if isinstance(blob, msgpack.ExtType):
        if blob.code != ASCII_IDS:
            raise ValueError(f"not a token-id field: msgpack ExtType code {blob.code}")
        return _ascii_to_array(blob.data).tolist()
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
    """float32 little-endian bytes back to floats; None stays None."""
    if blob is None:
        return None
    arr = array.array("f")
    arr.frombytes(blob)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


def token_ids(record: dict, name: str) -> list[int] | None:
    """A token-id field as a list ("prompt_token_ids" or "completion_token_ids")."""
    return unpack_ids(record.get(name))


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
    `completion_token_ids`); the prompt fields may be ASCII ids instead; an error's stage is one of ERROR_STAGES;
    `weight_version` is a string or nil."""
    unknown = set(record) - set(FIELDS)
    if unknown:
        raise ValueError(f"not record fields: {sorted(unknown)}")
    for name in ("prompt_token_ids", "completion_token_ids", "completion_logprobs", "prompt_tail_ids"):
        blob = record.get(name)
        if isinstance(blob, msgpack.ExtType) and name in ASCII_ID_FIELDS:
            if blob.code != ASCII_IDS or not is_ascii_ids(blob.data):
                raise ValueError(f"{name} must be ASCII ids (ExtType {ASCII_IDS}: digits joined by commas)")
        elif blob is not None and (not isinstance(blob, (bytes, bytearray)) or len(blob) % 4):
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
    """One record's bytes on disk: a msgpack map, binary fields as bin."""
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
