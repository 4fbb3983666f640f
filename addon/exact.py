"""Exact on-policy mode (`polar_exact`): the model sees exactly the tokens it sampled. docs/architecture.md#exact-mode.

Normally every turn's history is re-rendered by the chat template, so the context of turn N+1 is not "prompt N +
the ids sampled at turn N" (non-canonical BPE splits, re-serialized tool-call JSON, stripped reasoning). In this
mode the gateway keeps, per session, the turns it answered; for a new request it finds the deepest cached turn whose
messages plus our reply are a prefix of the new history, renders the new history with `/tokenize`, and splices:

    cached prompt + sampled ids (+ the template's end-of-turn id when the turn ended without it)
    + the canonical render's tail after the same number of end-of-turn ids

The spliced ids go upstream as `kv_transfer_params.prompt_token_ids` (vLLM uses them verbatim and still runs its
tool-call and reasoning parsers), and the echoed prompt ids are checked against what was sent. A turn that cannot
be spliced takes the normal path; its record says why (`exact.fallback_reason`). Nothing fails because of this mode.

After a restart (or an eviction) the cache no longer holds the turns a continuing session needs. On such a miss —
no cached turn is a parent, and the session's turns have not been rebuilt since it entered the cache — the gateway
rebuilds the session's turns from the flow files in the writer's directory (DESIGN §7) and looks once more:

- `turn_index.TurnIndex` indexes the directory by session, lazily at the first miss and incrementally after (a
  file is read once, from where the last pass stopped); it keeps only records `commit` can have cached.
- `turn_from_record` is the rule `commit` applies, read back from a record (its `upstream_request` gives the
  messages and the settings key, `assistant` the reply, the prompt rebuilt from its compact form): the rebuilt
  turns are the ones this process would hold had it never lost them — same ids, same keys, same ids to splice —,
  the last `max_turns` of them, restored ahead of turns cached since.
- The work runs in a worker thread under one lock (the event loop keeps serving). Unreadable files are skipped
  and logged once; if the session's own records cannot be read back and the lookup still misses, the reason is
  `rebuild_failed`, else `no_parent` / `history_edited` as before.

The probe runs lazily, inside the first generation call that reaches this mode — not when mitmdump starts — and
again for each new (backend URL, model, backend version), e.g. after a connection failure made the gateway resolve
a changed backend. It renders "Polar probe" a few ways with `/tokenize` (about 15 small calls) to learn the
template's end-of-turn id, then sends one 1-token chat call with deliberately non-canonical ids and requires them
echoed unchanged. A refusal is logged once and kept for the life of the process: every record says `mode_refused`.
A probe that could not run (backend down, 5xx) is not kept: that call records `probe_error`, the next one retries.

Record field `exact` (a map on every generation record while the mode is on; nil when it is off, and on calls that
failed before reaching the mode: bad agent input, backend unreachable while resolving the model):
- `path` str: `exact` (the spliced ids were sent and echoed unchanged) | `normal` (the template's own render).
- `fallback_reason` str|nil: nil on the exact path, else one of the codes below.
- `detail` str, only with some reasons: the error text (probe_error, mode_refused, render_failed,
  boundary_not_found, echo_mismatch, internal_error).
- `parent` str|nil: id of the cached record whose prompt + completion head the splice (kept when a later step
  fell back, e.g. media or echo_mismatch).
- `splice_pos` int|nil: length of that head (parent prompt + sampled ids, + 1 when the template's end-of-turn id
  was appended): where the canonical tail starts in the ids sent.
- `eot_count` int|nil: end-of-turn ids in the head, i.e. turns ended before the new messages; the canonical render is
  cut after its `eot_count`-th end-of-turn id.
- `render_len` int|nil: length of the canonical render (`/tokenize` of the new history, generation prompt on).
- `drift` int|nil: how far the canonical render of the shared history is from what the model really saw: positions
  that differ, aligned from the start, plus the difference in length. 0: the template re-renders the sampled turns
  exactly (the normal path would have given the same prompt); > 0: the normal path would have shown the model another
  context (the processor's `context_mismatch`).
- `prep_ms` float: time spent preparing the call in this mode (the probe included, on the calls that ran or
  awaited it).
- `rebuild` map, only on calls that rebuilt their session's turns from the flow files: `records` (the session's
  records read back), `turns` (turns restored to the cache), `skipped` (records of the session that could not be
  read back or whose compact prompt could not be rebuilt), `bad_files` (flow files of the directory skipped in
  part so far), `ms` (time spent).
The four numbers are nil when no splice was computed (no parent, media, render_failed, and boundary_not_found, which
sets only `render_len`). Prompt ids are stored compactly (`prompt_ref` {id, len} + `prompt_tail_ids`, see
docs/records.md) whenever a parent was found and the echoed prompt starts with its prompt, so token arrays stop
growing quadratically; `record.PromptResolver` rebuilds them. On the exact path the recorded `upstream_request`
carries `"<record prompt_token_ids>"` instead of repeating the ids; after an echo mismatch it keeps the ids sent.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import httpx
import orjson

from polar import records as rec

from .stream_reader import StreamReader
from .turn_index import PassStats, ReadStats, TurnIndex

log = logging.getLogger("polar.exact")

PROBE_TEXT = "Polar probe"
# The upstream_request keeps no copy of the spliced ids when the echo matched: they equal the record's prompt.
ELIDED_IDS = "<record prompt_token_ids>"

# fallback_reason values (short codes; `detail` carries the message where there is one)
NEW_CONVERSATION = "new_conversation"  # no assistant turn in the history: a first call, nothing to splice
NO_PARENT = "no_parent"            # earlier turns in the history, none cached (restart, eviction, another proxy)
HISTORY_EDITED = "history_edited"  # turns are cached, but none is a prefix of the new history
MEDIA = "media"                    # non-text content: vLLM 0.32+ silently ignores the ids then
BOUNDARY = "boundary_not_found"    # the canonical render has fewer end-of-turn ids than the splice needs
ECHO = "echo_mismatch"             # the backend did not use the ids we sent
REFUSED = "mode_refused"           # the probe failed: the backend does not take prompt ids
PROBE_ERROR = "probe_error"        # the probe could not run (backend down); retried at the next call
RENDER = "render_failed"           # /tokenize failed
TOO_LONG = "prompt_too_long"       # the spliced prompt does not fit the context: the normal path answers
NO_IDS = "no_token_ids"            # the parent turn has no token ids
REBUILD_FAILED = "rebuild_failed"  # no parent, and the session's records in the flow files could not all be read


# ---------------------------------------------------------------------------------------------------- comparison

def _text(content) -> str | bytes:
    """Message content as comparable text: parts of type text joined; anything else kept as canonical JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text") or "") for p in content)
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS)


def _args(arguments):
    """Tool-call arguments compared as parsed JSON (agents re-serialize them), raw text when not JSON."""
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def _norm(m: dict, keep_reasoning: bool = True) -> bytes:
    """A message's comparison key: tool-call ids ignored, arguments parsed, assistant text stripped."""
    role = m.get("role")
    content = _text(m.get("content"))
    if role == "assistant" and isinstance(content, str):
        content = content.strip()
    out = {"role": role, "content": content if isinstance(content, str) else content.decode()}
    if m.get("name") is not None:
        out["name"] = m["name"]
    calls = m.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [[(c.get("function") or {}).get("name"), _args((c.get("function") or {}).get("arguments"))]
                             for c in calls]
    reasoning = m.get("reasoning_content") or m.get("reasoning") or ""
    if keep_reasoning and reasoning.strip():
        out["reasoning"] = reasoning.strip()
    return orjson.dumps(out, option=orjson.OPT_SORT_KEYS)


def _has_reasoning(m: dict) -> bool:
    return bool((m.get("reasoning_content") or m.get("reasoning") or "").strip())


@dataclass(frozen=True)
class MsgKey:
    full: bytes       # with reasoning
    bare: bytes       # without reasoning
    reasoning: bool

    @classmethod
    def of(cls, m: dict) -> "MsgKey":
        bare = _norm(m, keep_reasoning=False)
        has = _has_reasoning(m)
        return cls(_norm(m) if has else bare, bare, has)

    def matches(self, new: "MsgKey") -> bool:
        """`new` (the agent's message now) equals this cached one; reasoning the agent dropped is allowed."""
        return new.full == self.full or (not new.reasoning and new.bare == self.bare)


def has_media(messages: list) -> bool:
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(not (isinstance(p, dict) and p.get("type") == "text") for p in content):
            return True
    return False


def settings_key(model: str, body: dict) -> bytes:
    """What must be equal for a cached turn to be a parent: model, tools and template settings."""
    return orjson.dumps({"model": model, "tools": body.get("tools") or [],
                         "kwargs": body.get("chat_template_kwargs") or {}}, option=orjson.OPT_SORT_KEYS)


# ---------------------------------------------------------------------------------------------------- the cache

@dataclass
class CachedTurn:
    """One answered turn: what the model saw (prompt), what it sampled, and the history it answered."""

    id: str
    key: bytes
    messages: list[MsgKey]
    reply: MsgKey
    prompt: array.array
    completion: array.array
    t: float = field(default_factory=time.time)

    @property
    def nbytes(self) -> int:
        return 4 * (len(self.prompt) + len(self.completion)) + sum(len(k.full) + len(k.bare) for k in self.messages) \
            + 256

    def full(self) -> list[int]:
        return self.prompt.tolist() + self.completion.tolist()


class TurnCache:
    """Per-session answered turns; LRU over sessions, bounded by session count, turns per session and bytes."""

    def __init__(self, max_sessions: int = 4096, max_turns: int = 32, max_bytes: int = 512 << 20):
        self.max_sessions, self.max_turns, self.max_bytes = max_sessions, max_turns, max_bytes
        self.sessions: OrderedDict[object, list[CachedTurn]] = OrderedDict()
        self.nbytes = 0
        # Sessions whose turns were rebuilt from the flow files since they entered the cache: a miss there is real.
        self.restored: set = set()

    def turns(self, session) -> list[CachedTurn]:
        turns = self.sessions.get(session)
        if turns is None:
            return []
        self.sessions.move_to_end(session)
        return turns

    def add(self, session, turn: CachedTurn) -> None:
        turns = self.sessions.setdefault(session, [])
        self.sessions.move_to_end(session)
        turns.append(turn)
        self.nbytes += turn.nbytes
        while len(turns) > self.max_turns:
            self.nbytes -= turns.pop(0).nbytes
        while self.sessions and (len(self.sessions) > self.max_sessions or self.nbytes > self.max_bytes):
            oldest, old_turns = next(iter(self.sessions.items()))
            if oldest is session and len(old_turns) > 1:
                self.nbytes -= old_turns.pop(0).nbytes  # keep the newest turn of the live session
                continue
            if oldest is session:
                break
            self.nbytes -= sum(t.nbytes for t in old_turns)
            del self.sessions[oldest]
            self.restored.discard(oldest)

    def restore(self, session, rebuilt: list[CachedTurn], complete: bool = True) -> None:
        """Put back a session's turns rebuilt from the flow files (in the order they were committed), ahead of the
        turns cached since that are not among them; the bounds apply as in `add`. `complete`: every record could
        be read, so the session is marked restored (not rebuilt again while it stays cached)."""
        current = self.sessions.pop(session, [])
        self.nbytes -= sum(t.nbytes for t in current)
        seen = {t.id for t in rebuilt}
        for t in rebuilt + [t for t in current if t.id not in seen]:
            self.add(session, t)
        if complete and session in self.sessions:
            self.restored.add(session)


def find_parent(turns: list[CachedTurn], key: bytes, new: list[MsgKey]) -> CachedTurn | None:
    """The deepest cached turn whose messages + our reply are a prefix of `new` (ties: the latest)."""
    best = None
    for t in turns:
        n = len(t.messages)
        if t.key != key or n + 1 > len(new) or (best is not None and n < len(best.messages)):
            continue
        if all(c.matches(m) for c, m in zip(t.messages, new)) and t.reply.matches(new[n]):
            best = t
    return best


# ---------------------------------------------------------------------------------------------------- the splice

@dataclass(frozen=True)
class Splice:
    ids: list[int]
    splice_pos: int    # where the canonical tail starts in ids
    eot_count: int     # end-of-turn ids before the splice position
    render_len: int    # length of the canonical render of the new history
    drift: int         # positions where the canonical re-render of the shared part differs from what was sampled
    canonical_pos: int # where the tail starts in the canonical render


class NoBoundary(ValueError):
    pass


def splice(prompt: list[int], completion: list[int], canonical: list[int], eot: int) -> Splice:
    """prompt + completion (+ eot when the turn did not end with it) + canonical[after the same number of eots]."""
    base = list(prompt) + list(completion)
    if not completion or completion[-1] != eot:
        base.append(eot)
    n = base.count(eot)
    seen, pos = 0, -1
    for i, t in enumerate(canonical):
        if t == eot:
            seen += 1
            if seen == n:
                pos = i + 1
                break
    if pos < 0:
        raise NoBoundary(f"the canonical render has {seen} end-of-turn ids, the splice needs {n}")
    if pos >= len(canonical):
        raise NoBoundary("the canonical render ends at the splice boundary (no new messages)")
    shared = canonical[:pos]
    drift = sum(1 for a, b in zip(shared, base) if a != b) + abs(len(shared) - len(base))
    return Splice(base + canonical[pos:], len(base), n, len(canonical), drift, pos)


# ---------------------------------------------------------------------------------------------------- the mode

@dataclass
class ExactTurn:
    """One call's exact-mode state, from prepare() to the record."""

    session: object
    key: bytes
    messages: list[MsgKey]
    meta: dict
    parent: CachedTurn | None = None
    sent: list[int] | None = None  # the spliced prompt ids shaping sends, or None (the normal path)


@dataclass
class ProbeResult:
    ok: bool
    eot: int | None = None
    message: str = ""


class ExactMode:
    """The mode's process-wide state: the probe result per backend and the turn cache."""

    def __init__(self, cache: TurnCache | None = None):
        self.cache = cache or TurnCache()
        self.probes: dict[tuple, ProbeResult] = {}
        self._lock = asyncio.Lock()
        self.indexes: dict[str, TurnIndex] = {}  # flow directory → its session index, kept for the process's life
        self._rebuild_lock = asyncio.Lock()

    # ------------------------------------------------------------------------------------------ probe

    async def probe(self, backend, info) -> ProbeResult:
        """Learn the end-of-turn id and check that the backend echoes non-canonical prompt ids unchanged."""
        ident = (backend.base_url, info.model, info.version)
        found = self.probes.get(ident)
        if found is not None:
            return found
        async with self._lock:
            found = self.probes.get(ident)
            if found is not None:
                return found
            result = await _run_probe(backend, info)  # raises httpx/GatewayError-like trouble: not cached
            self.probes[ident] = result
            if result.ok:
                log.info("polar_exact: backend %s %s takes prompt token ids; end-of-turn id %d",
                         info.kind, info.version, result.eot)
            else:
                log.error("polar_exact REFUSED for %s %s (model %s): %s — every call takes the normal path",
                          info.kind, info.version, info.model, result.message)
            return result

    # ------------------------------------------------------------------------------------------ per call

    async def prepare(self, backend, info, body: dict, session, flows: str | None = None) -> ExactTurn:
        """Before the upstream call, given the shaped chat body: find the parent, render, splice. On success
        `turn.sent` holds the prompt ids for shaping to send (shaping also clamps max_tokens to them). `flows`: the
        flow directory this process writes, where a miss rebuilds the session's turns (None: no rebuild). Never
        raises: every trouble becomes a `fallback_reason` and the normal path."""
        t0 = time.perf_counter()
        try:
            turn = await self._prepare(backend, info, body, session, flows)
        except Exception as exc:  # noqa: BLE001 — a bug here must not fail the call
            log.exception("polar_exact: prepare failed")
            # No `splice_pos` key and no settings key: commit() caches nothing, and may_be_cached() knows it.
            turn = ExactTurn(session, b"", [], {"parent": None, "path": "normal", "fallback_reason": "internal_error",
                                                "detail": f"{exc!r}"[:500]})
        turn.meta["prep_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        return turn

    async def _prepare(self, backend, info, body: dict, session, flows: str | None) -> ExactTurn:
        messages = body.get("messages") or []
        keys = [MsgKey.of(m) for m in messages if isinstance(m, dict)]
        turn = ExactTurn(session, settings_key(info.model, body), keys,
                         {"parent": None, "splice_pos": None, "eot_count": None, "render_len": None, "drift": None,
                          "path": "normal", "fallback_reason": None})
        meta = turn.meta
        try:
            probe = await self.probe(backend, info)
        except Exception as exc:  # noqa: BLE001 — the mode never fails a call
            meta.update(fallback_reason=PROBE_ERROR, detail=f"{exc!r}"[:500])
            return turn
        if not probe.ok:
            meta.update(fallback_reason=REFUSED, detail=probe.message)
            return turn
        if not any(m.get("role") == "assistant" for m in messages if isinstance(m, dict)):
            # A first call (a new conversation, or a side call such as a title or router call): no cached turn can
            # be its parent, whatever else this session has answered. Not a miss, and not an edit.
            meta["fallback_reason"] = NEW_CONVERSATION
            return turn
        parent = turn.parent = await self._lookup(turn, flows)
        if parent is None:
            return turn
        meta["parent"] = parent.id
        if has_media(messages):
            meta["fallback_reason"] = MEDIA
            return turn
        try:
            canonical = await backend.render(body, info.model)
        except Exception as exc:  # noqa: BLE001
            meta.update(fallback_reason=RENDER, detail=f"{exc!r}"[:500])
            return turn
        try:
            s = splice(parent.prompt.tolist(), parent.completion.tolist(), canonical, probe.eot)
        except NoBoundary as exc:
            meta.update(fallback_reason=BOUNDARY, detail=str(exc), render_len=len(canonical))
            return turn
        meta.update(splice_pos=s.splice_pos, eot_count=s.eot_count, render_len=s.render_len, drift=s.drift)
        if info.max_model_len and len(s.ids) >= info.max_model_len:
            meta["fallback_reason"] = TOO_LONG
            return turn
        turn.sent = s.ids
        meta["path"] = "exact"
        return turn

    async def _lookup(self, turn: ExactTurn, flows: str | None) -> CachedTurn | None:
        """The parent among the session's cached turns; on a miss in a session not rebuilt since it entered the
        cache, once more after rebuilding its turns from the flow files. A miss sets the fallback reason:
        `rebuild_failed` when the session's records could not all be read back, else `history_edited` when turns
        are cached, else `no_parent`."""
        session, meta = turn.session, turn.meta
        turns = self.cache.turns(session)
        parent = find_parent(turns, turn.key, turn.messages) if turns else None
        failure = None
        if parent is None and flows is not None and session not in self.cache.restored:
            turns, failure = await self._rebuild(session, flows, meta)
            parent = find_parent(turns, turn.key, turn.messages) if turns else None
        if parent is None:
            if failure is not None:
                meta.update(fallback_reason=REBUILD_FAILED, detail=failure)
            else:
                meta["fallback_reason"] = HISTORY_EDITED if turns else NO_PARENT
        return parent

    async def _rebuild(self, session, flows: str, meta: dict) -> tuple[list[CachedTurn], str | None]:
        """Restore the session's turns from the flow files in `flows` (DESIGN §7): one rebuild at a time, in a
        worker thread. Returns the session's cached turns now and why the rebuild fell short (None: it did not)."""
        async with self._rebuild_lock:
            if session in self.cache.restored:  # rebuilt by another call while this one waited
                return self.cache.turns(session), None
            flows = os.path.abspath(flows)
            index = self.indexes.get(flows)
            if index is None:
                index = self.indexes[flows] = TurnIndex(flows, INDEX_FIELDS, may_be_cached)
            t0 = time.perf_counter()
            try:
                done = await asyncio.to_thread(rebuild_turns, index, session, self.cache.max_turns)
            except Exception as exc:  # noqa: BLE001 — an unreadable directory or a bug: the call goes on without it
                log.error("polar_exact: rebuilding session %r from %s failed: %r", session, flows, exc,
                          exc_info=not isinstance(exc, OSError))
                done = Rebuilt([], ReadStats(), PassStats(), f"{exc!r}"[:500])
            ms = round((time.perf_counter() - t0) * 1000, 3)
            self.cache.restore(session, done.turns, complete=done.failure is None)
            meta["rebuild"] = {"records": done.read.read, "turns": len(done.turns), "skipped": done.skipped,
                               "bad_files": len(index.bad_files), "ms": ms}
            log.info("polar_exact: session %r rebuilt from %d records: %d turns, %d skipped; index pass: %d files, "
                     "%d bytes, %d records kept, %d partial; %d flow files skipped in part; %.1f ms", session,
                     done.read.read, len(done.turns), done.skipped, done.passed.files_read, done.passed.bytes_read,
                     done.passed.records_kept, done.passed.partial, len(index.bad_files), ms)
            return self.cache.turns(session), done.failure

    def finish(self, turn: ExactTurn, record: dict, prompt: list[int] | None) -> None:
        """Before the record is written: echo check, `exact` map, compact prompt form. Never raises."""
        try:
            self._finish(turn, record, prompt)
        except Exception:  # noqa: BLE001 — the record must still be written, in its plain form
            log.exception("polar_exact: finish failed for %s", record.get("id"))
            record["exact"] = dict(turn.meta, fallback_reason=turn.meta.get("fallback_reason") or "internal_error")

    def _finish(self, turn: ExactTurn, record: dict, prompt: list[int] | None) -> None:
        meta = turn.meta
        if turn.sent is not None:
            if prompt is not None and prompt == turn.sent:
                record["upstream_request"] = elide_prompt_ids(record["upstream_request"])
            elif prompt is not None:
                # vLLM used some other prompt: the record keeps the echo (the truth) and the ids we sent.
                meta.update(path="normal", fallback_reason=ECHO,
                            detail=f"sent {len(turn.sent)} ids, backend echoed {len(prompt)}")
                log.warning("polar_exact: echo mismatch on %s (sent %d ids, echoed %d)", record.get("id"),
                            len(turn.sent), len(prompt))
        record["exact"] = meta
        if turn.parent is not None and prompt is not None:
            compact(record, prompt, turn.parent)

    def commit(self, turn: ExactTurn, record: dict, prompt: list[int] | None, completion: list[int] | None,
               reply: dict | None) -> None:
        """After the record is on disk: cache the turn as a parent for the next request. Never raises."""
        try:
            self._commit(turn, record, prompt, completion, reply)
        except Exception:  # noqa: BLE001
            log.exception("polar_exact: could not cache turn %s", record.get("id"))

    def _commit(self, turn: ExactTurn, record: dict, prompt, completion, reply) -> None:
        # The rule turn_from_record() reads back from the record: keep the two in step.
        if not turn.key or record.get("error") is not None or prompt is None or completion is None or reply is None:
            return
        self.cache.add(turn.session, cached_turn(record["id"], turn.key, turn.messages, prompt, completion, reply))


def cached_turn(record_id: str, key: bytes, messages: list[MsgKey], prompt, completion, reply: dict,
                t: float | None = None) -> CachedTurn:
    """The cache entry of one answered turn: what commit() stores, and what a rebuild from its record restores
    (`prompt`, `completion`: ids, as a list or an int32 array)."""
    reply_msg = {"role": "assistant", "content": reply.get("content"), "reasoning": reply.get("reasoning"),
                 "tool_calls": reply.get("tool_calls")}
    return CachedTurn(record_id, key, messages, MsgKey.of(reply_msg), array.array("i", prompt),
                      array.array("i", completion), **({"t": t} if t is not None else {}))


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
    if not all(isinstance(x, bytes) for x in ids) or not isinstance(record.get("assistant"), dict):
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


def _ids_array(blob: bytes) -> array.array:
    """int32 little-endian ids as the cache stores them (record.unpack_ids without the list)."""
    arr = array.array("i")
    arr.frombytes(blob)
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


def elide_prompt_ids(upstream_request: bytes) -> bytes:
    """The request as sent, but with the prompt ids replaced by ELIDED_IDS (they equal the record's prompt)."""
    body = orjson.loads(upstream_request)
    body["kv_transfer_params"] = dict(body.get("kv_transfer_params") or {}, prompt_token_ids=ELIDED_IDS)
    return orjson.dumps(body)


def compact(record: dict, prompt: list[int], parent: CachedTurn) -> None:
    """Store the prompt as `prompt_ref` {id, len} + `prompt_tail_ids` when it starts with the parent's prompt."""
    n_prompt = len(parent.prompt)
    if len(prompt) < n_prompt or array.array("i", prompt[:n_prompt]) != parent.prompt:
        return
    k, comp = 0, parent.completion
    limit = min(len(comp), len(prompt) - n_prompt)
    while k < limit and prompt[n_prompt + k] == comp[k]:
        k += 1
    cut = n_prompt + k
    record["prompt_ref"] = {"id": parent.id, "len": cut}
    record["prompt_tail_ids"] = rec.pack_ids(prompt[cut:])
    record["prompt_token_ids"] = None


# ---------------------------------------------------------------------------------------------------- backend calls

def _find(hay: list[int], needle: list[int]) -> int:
    for i in range(len(hay) - len(needle) + 1):
        if hay[i:i + len(needle)] == needle:
            return i
    return -1


def end_of_turn(one: list[int], three: list[int], word: list[int]) -> int | None:
    """The template's end-of-turn id from renders of [user W] and [user W, assistant W, user W] (no generation
    prompt): the first id after W that occurs exactly twice more in the longer render (once per added message)."""
    at = _find(one, word)
    if at < 0:
        return None
    for t in one[at + len(word):]:
        if three.count(t) - one.count(t) == 2:
            return t
    return None


async def _run_probe(backend, info) -> ProbeResult:
    if info.kind != "vllm":
        return ProbeResult(False, message=f"backend kind {info.kind!r}: prompt token ids on chat need vLLM ≥ 0.30")
    model = info.model
    user = {"role": "user", "content": PROBE_TEXT}
    gate = asyncio.Semaphore(4)  # a few at a time: small servers have small listen backlogs

    async def limited(coro):
        async with gate:
            return await coro

    one, three, canonical, word, *chars = await asyncio.gather(*map(limited, (
        backend.render({"messages": [user]}, model, add_generation_prompt=False),
        backend.render({"messages": [user, {"role": "assistant", "content": PROBE_TEXT}, user]}, model,
                       add_generation_prompt=False),
        backend.render({"messages": [user]}, model),
        backend.tokens(PROBE_TEXT, model),
        *(backend.tokens(ch, model) for ch in PROBE_TEXT))))
    eot = end_of_turn(one, three, word)
    if eot is None:
        return ProbeResult(False, message="the chat template has no end-of-turn token the probe could identify "
                                          "(exact splicing counts end-of-turn ids)")
    at = _find(canonical, word)
    split = [t for ids in chars for t in ids]  # one token per character: not how the tokenizer splits the word
    if at < 0 or split == word:
        return ProbeResult(False, message="could not build non-canonical probe ids for this tokenizer")
    ids = canonical[:at] + split + canonical[at + len(word):]
    body = {"model": model, "messages": [user], "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": 1, "logprobs": True, "top_logprobs": 0, "return_token_ids": True, "temperature": 1.0,
            "kv_transfer_params": {"prompt_token_ids": ids}}
    reader = StreamReader(keep_logprob_entries=False)
    async with backend.client.stream("POST", backend.base_url + "/chat/completions", content=orjson.dumps(body),
                                     timeout=httpx.Timeout(120.0, connect=backend.client.timeout.connect)) as resp:
        if resp.status_code != 200:
            text = (await resp.aread())[:300]
            if resp.status_code >= 500:
                raise RuntimeError(f"probe call answered {resp.status_code}: {text!r}")
            return ProbeResult(False, message=f"the backend rejected kv_transfer_params.prompt_token_ids "
                                              f"({resp.status_code}: {text!r})")
        async for data in resp.aiter_raw():
            reader.feed(data)
    echoed = reader.prompt_token_ids
    if echoed != ids:
        got = "no prompt ids" if echoed is None else f"{len(echoed)} ids" + (
            " (its own render)" if echoed == canonical else "")
        return ProbeResult(False, message=f"the backend did not use the prompt token ids it was sent (sent {len(ids)} "
                                          f"non-canonical ids, echoed {got}); needs vLLM 0.30–0.33 "
                                          "kv_transfer_params.prompt_token_ids on /v1/chat/completions")
    return ProbeResult(True, eot=eot, message="ok")
