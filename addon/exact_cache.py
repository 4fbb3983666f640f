"""Exact mode's turn cache (`exact.py` has the mode): the comparison keys of chat messages, one answered turn
(`CachedTurn`), the per-session cache bounded by sessions, turns and bytes, and the parent lookup — the deepest
cached turn whose messages plus our reply are a prefix of the new history."""

from __future__ import annotations

import array
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import orjson


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


def cached_turn(record_id: str, key: bytes, messages: list[MsgKey], prompt, completion, reply: dict,
                t: float | None = None) -> CachedTurn:
    """The cache entry of one answered turn: what commit() stores, and what a rebuild from its record restores
    (`prompt`, `completion`: ids, as a list or an int32 array)."""
    reply_msg = {"role": "assistant", "content": reply.get("content"), "reasoning": reply.get("reasoning"),
                 "tool_calls": reply.get("tool_calls")}
    return CachedTurn(record_id, key, messages, MsgKey.of(reply_msg), array.array("i", prompt),
                      array.array("i", completion), **({"t": t} if t is not None else {}))
