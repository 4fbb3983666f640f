"""Exact mode after a restart: a session's turns rebuilt from the flow files, exactly as `ExactMode.commit` cached
them (docs/architecture.md#exact-mode, Restarts). `turn_from_record` is commit's rule read back from a record;
`rebuild_turns` runs it over the session's records (`turn_index.TurnIndex`) in a worker thread."""

from __future__ import annotations

import array
import logging
import sys
from collections import deque
from dataclasses import dataclass

import msgpack
import orjson

from polar import records as rec

from .exact_cache import CachedTurn, MsgKey, cached_turn, settings_key
from .turn_index import PassStats, ReadStats, TurnIndex

log = logging.getLogger("polar.exact")


# ---------------------------------------------------------------------------------------------------- the rebuild

# The small record fields the index pass builds, and the part of commit()'s rule they decide.
INDEX_FIELDS = frozenset({"id", "exact", "error"})


def may_be_cached(fields: dict) -> bool:
    """Whether commit() can have cached the record: the mode prepared the call (an `exact` map with `splice_pos`;
    a failed prepare() leaves none, and no settings key) and the call did not fail."""
    meta = fields.get("exact")
    return isinstance(meta, dict) and "splice_pos" in meta and fields.get("error") is None


# The fields turn_from_record reads.
_TURN_FIELDS = ("id", "exact", "error", "prompt_token_ids", "completion_token_ids", "assistant", "upstream_request",
                "t_end")


def cacheable(record: dict) -> dict | None:
    """The fields of `record` that make its cached turn, when commit() cached one (the record's compact prompt
    already rebuilt): `may_be_cached`, and the prompt and completion ids and the reply were there. None otherwise."""
    if not may_be_cached(record):
        return None
    ids = (record.get("prompt_token_ids"), record.get("completion_token_ids"), record.get("upstream_request"))
    if not (rec.is_ids(ids[0]) and all(isinstance(x, bytes) for x in ids[1:])) \
            or not isinstance(record.get("assistant"), dict):
        return None
    return {name: record.get(name) for name in _TURN_FIELDS}


def turn_from_record(record: dict, keys: dict[bytes, MsgKey] | None = None) -> CachedTurn | None:
    """The turn commit() cached when it wrote `record` (whose compact prompt is rebuilt), or None when it cached
    none. The settings key and messages come from `upstream_request`: the body shaped from the same chat body as
    the draft prepare() keyed, with the same model, messages, tools and template kwargs (exact mode only adds the
    prompt ids and clamps max_tokens). `keys` memoizes message keys by the message's JSON across one session's
    records, whose histories share their prefix (building every key again is quadratic in the turns)."""
    fields = cacheable(record)
    if fields is None:
        return None
    body = orjson.loads(fields["upstream_request"])
    keys = {} if keys is None else keys
    messages = []
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            raw = orjson.dumps(m)  # exact: 1 and 1.0 are equal dict values but different JSON, maybe different keys
            key = keys.get(raw)
            messages.append(key if key is not None else keys.setdefault(raw, MsgKey.of(m)))
    t_end = fields["t_end"]
    return cached_turn(fields["id"], settings_key(body.get("model"), body), messages,
                       _ids_array(fields["prompt_token_ids"]), _ids_array(fields["completion_token_ids"]),
                       fields["assistant"], t_end if isinstance(t_end, float) else None)


def _ids_array(blob: bytes | msgpack.ExtType) -> array.array:
    """Ids of either encoding as the cache stores them (int32; record.unpack_ids without the list)."""
    arr = array.array("i")
    arr.frombytes(rec.ids_blob(blob))
    if sys.byteorder != "little":
        arr.byteswap()
    return arr


@dataclass
class Rebuilt:
    turns: list[CachedTurn]
    read: ReadStats
    passed: PassStats
    failure: str | None = None

    @property
    def skipped(self) -> int:
        return len(self.read.unreadable) + len(self.read.unresolved)


def rebuild_turns(index: TurnIndex, session, max_turns: int) -> Rebuilt:
    """A session's turns as commit() cached them, from the flow files (runs in a worker thread): the index extended
    with what was written since its last pass, then the session's records in the order they were written, each
    through turn_from_record, the last `max_turns` kept (as TurnCache.add keeps them). Every record is read (a
    compact prompt needs the one it refers to), but only the last `max_turns` become turns: building one costs a
    message key per message of its history."""
    passed = index.refresh()
    read = ReadStats()
    last: deque[dict] = deque(maxlen=max_turns)
    for record in index.session_records(session, read):
        fields = cacheable(record)
        if fields is not None:
            last.append(fields)
    kept, keys = [], {}
    for fields in last:
        try:
            kept.append(turn_from_record(fields, keys))
        except Exception as exc:  # noqa: BLE001 — commit() failed on the same data: it cached nothing either
            log.warning("polar_exact: record %s is not a turn to cache: %r", fields.get("id"), exc)
    problems = read.unreadable + [f"{rid}: the record its compact prompt refers to was not found"
                                  for rid in read.unresolved]
    failure = (f"{len(problems)} of the session's records in the flow files could not be read back; first: "
               f"{problems[0]}"[:500]) if problems else None
    return Rebuilt(kept, read, passed, failure)
