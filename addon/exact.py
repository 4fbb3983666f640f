"""Exact on-policy mode (`polar_exact`): the model sees exactly the tokens it sampled. docs/architecture.md#exact-mode.

This module is the mode (per call: prepare, finish, commit) and the splice; `exact_cache` holds the turn cache and
the message keys, `exact_rebuild` the restart rebuild, `exact_probe` the probe.

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
rebuilds the session's turns from the flow files in the writer's directory (docs/architecture.md#exact-mode, Restarts)
and looks once more:

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
import time
from dataclasses import dataclass

import orjson

from polar import records as rec

from .exact_cache import CachedTurn, MsgKey, TurnCache, cached_turn, find_parent, has_media, settings_key
from .exact_probe import ProbeResult, _run_probe
from .exact_rebuild import INDEX_FIELDS, Rebuilt, may_be_cached, rebuild_turns, turn_from_record
from .turn_index import PassStats, ReadStats, TurnIndex

log = logging.getLogger("polar.exact")

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
        """Restore the session's turns from the flow files in `flows` (docs/architecture.md#exact-mode): one rebuild at
        a time, in a worker thread. Returns the session's cached turns now and why the rebuild fell short (None: it did
        not)."""
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
