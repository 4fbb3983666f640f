"""Trajectory reconstruction for one session group: prefix_merging and per_request (DESIGN §6 rules 1–4, 6–9).

Pure functions: they take one group's calls and return data plus notes (sequences, breaks, flag events). Nothing
here reads files or knows other sessions, so a group can be processed anywhere (the scale-out seam).

Routing (rules 3–4) is decided on prompt token ids only; sampled completion ids never route, because a sampled
turn may re-tokenize differently in the next prompt. `route_calls` answers with a small index; `route_calls_naive`
states the rules literally on Python lists, and the property tests hold the two to the same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from polar.processor.normalize import Call

FLAGS = ("context_mismatch", "missing_logprobs", "truncated_turn", "aborted_turn", "side_chain", "superseded",
         "constrained_decoding", "oversize")

# Break causes. prefix_diverged / no_eot_in_tail / context_mismatch come from the rules; model_changed is ours:
# one sequence is sampled by one model, so consecutive members served by different models start a new sequence.
BREAK_CAUSES = ("prefix_diverged", "no_eot_in_tail", "context_mismatch", "model_changed")

_HEAD = 64  # tokens in the routing index's bucket key
_HEAD_BYTES = _HEAD * 4


# ---------------------------------------------------------------------------------------------------- routing

@dataclass(frozen=True, slots=True)
class Route:
    """Where one eligible call went. `kind`: join (rule 3), replace (rule 4) or open (a new chain)."""

    kind: str
    chain: int
    replaced: int | None = None  # replace: the call (position in the input) that C superseded
    diverged_from: int | None = None  # open: the chain whose tip shares ≥ its first prompt with C's prompt
    diverged_pos: int | None = None  # open: that common prefix's length, in tokens


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int32 arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    neq = a[:n] != b[:n]
    i = int(neq.argmax())
    return i if neq[i] else n


def route_calls(prompts: Sequence[bytes]) -> list[Route]:
    """Rules 3–4 for calls in (t_start, id) order; prompts are int32 LE bytes. Same answer as route_calls_naive.

    The index: tips are unique (a call equal to a tip replaces instead of opening or joining), so rule 4 is one
    dict lookup. Rule 3 only has to look at tips whose first 64 tokens equal C's (or shorter tips), longest first,
    and the first tip C extends is the answer. Byte comparisons are memcmp."""
    tips: list[bytes] = []
    firsts: list[bytes] = []  # each chain's first prompt
    last: list[int] = []  # each chain's latest member (its position in the input): "started last" for ties
    exact: dict[bytes, int] = {}
    by_head: dict[bytes, set[int]] = {}  # tip[:HEAD] → chains whose tip has ≥ HEAD tokens
    short_tips: set[int] = set()  # chains whose tip has < HEAD tokens
    short_firsts: set[int] = set()  # chains whose first prompt has < HEAD tokens
    routes: list[Route] = []

    def place(c: int, tip: bytes) -> None:
        exact[tip] = c
        if len(tip) >= _HEAD_BYTES:
            short_tips.discard(c)
            by_head.setdefault(tip[:_HEAD_BYTES], set()).add(c)
        else:
            short_tips.add(c)

    for i, p in enumerate(prompts):
        c = exact.get(p)
        if c is not None:  # rule 4: P_C equals a tip
            routes.append(Route("replace", c, replaced=last[c]))
            last[c] = i
            continue
        head = p[:_HEAD_BYTES]
        bucket = by_head.get(head, ()) if len(p) >= _HEAD_BYTES else ()
        cands = sorted((c for c in (*bucket, *short_tips) if len(tips[c]) < len(p)),
                       key=lambda c: (len(tips[c]), last[c]), reverse=True)
        joined = next((c for c in cands if p.startswith(tips[c])), None)
        if joined is not None:  # rule 3: the longest tip C extends
            del exact[tips[joined]]
            tips[joined] = p
            last[joined] = i
            place(joined, p)
            routes.append(Route("join", joined))
            continue
        # A new chain. Did the conversation diverge from a chain (lcp with its tip ≥ its first prompt)?
        # lcp(P, T) ≥ len(first) ⟺ P starts with first, because every tip starts with its chain's first prompt.
        best: tuple[int, int, int] | None = None  # (pos, last, chain)
        pa = None
        for c in (*(by_head.get(head, ()) if len(p) >= _HEAD_BYTES else ()), *short_firsts):
            if len(firsts[c]) <= len(p) and p.startswith(firsts[c]):
                pa = np.frombuffer(p, "<i4") if pa is None else pa
                pos = common_prefix(pa, np.frombuffer(tips[c], "<i4"))
                if best is None or (pos, last[c]) > best[:2]:
                    best = (pos, last[c], c)
        n = len(tips)
        tips.append(p)
        firsts.append(p)
        last.append(i)
        if len(p) < _HEAD_BYTES:
            short_firsts.add(n)
        place(n, p)
        routes.append(Route("open", n, diverged_from=best[2] if best else None,
                            diverged_pos=best[0] if best else None))
    return routes


def route_calls_naive(prompts: Sequence[list[int]]) -> list[Route]:
    """Rules 3–4 read literally, on Python lists. The reference the index is tested against."""
    tips: list[list[int]] = []
    firsts: list[list[int]] = []
    last: list[int] = []
    routes: list[Route] = []
    for i, p in enumerate(prompts):
        # Rule 4 (goes before rule 3): if P_C equals a tip exactly, C replaces that chain's latest member.
        equal = [c for c in range(len(tips)) if tips[c] == p]
        if equal:
            c = max(equal, key=lambda c: last[c])
            routes.append(Route("replace", c, replaced=last[c]))
            last[c] = i
            continue
        # Rule 3: C extends T when len(T) < len(P_C) and P_C[:len(T)] == T; C joins the chain with the longest
        # tip it extends (ties: the tip whose call started last).
        ext = [c for c in range(len(tips)) if len(tips[c]) < len(p) and p[:len(tips[c])] == tips[c]]
        if ext:
            c = max(ext, key=lambda c: (len(tips[c]), last[c]))
            tips[c] = p
            last[c] = i
            routes.append(Route("join", c))
            continue
        # Otherwise C opens a new chain; if its prompt shares with some tip T a common prefix at least as long as
        # the first prompt of T's chain, the conversation diverged from T's chain at that position.
        div = []
        for c in range(len(tips)):
            t = tips[c]
            n = 0
            while n < min(len(t), len(p)) and t[n] == p[n]:
                n += 1
            if n >= len(firsts[c]):
                div.append((n, last[c], c))
        best = max(div) if div else None
        tips.append(p)
        firsts.append(p)
        last.append(i)
        routes.append(Route("open", len(tips) - 1, diverged_from=best[2] if best else None,
                            diverged_pos=best[0] if best else None))
    return routes


# ---------------------------------------------------------------------------------------------------- sequences

@dataclass
class Sequence_:
    """One output sequence (a row of sequences.parquet) before rewards are joined."""

    sequence_id: str
    chain_id: str
    session: str | None
    mode: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray | None
    call_ids: list[str]
    prompt_len: int
    flags: list[str]
    break_cause: str | None
    model: str | None
    t_first: float
    side_chain: bool = False
    group: str | None = None
    reward: float | None = None
    advantage: float | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def n_trainable(self) -> int:
        return int(self.loss_mask.sum())


@dataclass(frozen=True, slots=True)
class Note:
    """A break or a flag, with the call it is about and a token position in that chain's prompt coordinates."""

    session: str | None
    chain_id: str
    call_id: str
    cause: str
    token_pos: int


@dataclass
class GroupResult:
    """What merging one session group produced."""

    sequences: list[Sequence_] = field(default_factory=list)
    breaks: list[Note] = field(default_factory=list)
    flag_notes: list[Note] = field(default_factory=list)
    placement: dict[str, tuple[str, str]] = field(default_factory=dict)  # call_id → (sequence_id, chain_id)
    n_chains: int = 0
    sft_calls: list[Call] = field(default_factory=list)  # the last call of each main chain


class MissingEot(ValueError):
    """prefix_merging needs an end-of-turn set for a model and none is known (rule 5)."""


class _Builder:
    """Accumulates one sequence: prompt at mask 0, then completions at mask 1 and interstitials at mask 0."""

    def __init__(self, first: Call, chain_id: str, mode: str, break_cause: str | None):
        self.calls = [first]
        self.parts: list[np.ndarray] = [first.prompt, first.completion]
        self.spans: list[tuple[int, Call]] = [(len(first.prompt), first)]  # (start of completion, call)
        self.n = len(first.prompt) + len(first.completion)
        self.chain_id, self.mode, self.break_cause = chain_id, mode, break_cause
        self.flags: set[str] = set()

    def extend(self, interstitial: np.ndarray, call: Call) -> None:
        self.parts.append(interstitial)
        self.n += len(interstitial)
        self.spans.append((self.n, call))
        self.parts.append(call.completion)
        self.n += len(call.completion)
        self.calls.append(call)

    def finish(self, session: str | None) -> Sequence_:
        ids = np.concatenate(self.parts) if len(self.parts) > 1 else self.parts[0].copy()
        mask = np.zeros(self.n, dtype=np.uint8)
        lps: np.ndarray | None = np.zeros(self.n, dtype=np.float32)
        for start, call in self.spans:
            m = len(call.completion)
            mask[start:start + m] = 1
            if m and call.logprobs is None:
                lps = None
            elif lps is not None and m:
                lps[start:start + m] = call.logprobs
        flags = set(self.flags)
        if lps is None:
            flags.add("missing_logprobs")
        if any(c.constrained for c in self.calls):
            flags.add("constrained_decoding")
        first = self.calls[0]
        return Sequence_(
            sequence_id=first.id, chain_id=self.chain_id, session=session, mode=self.mode, input_ids=ids,
            loss_mask=mask, logprobs=lps, call_ids=[c.id for c in self.calls], prompt_len=len(first.prompt),
            flags=[f for f in FLAGS if f in flags], break_cause=self.break_cause, model=first.model,
            t_first=first.t_start,
        )


class InvariantError(AssertionError):
    """An output sequence broke an invariant: a bug in this module, never bad input."""


def check_sequence(seq: Sequence_, calls: dict[str, Call]) -> None:
    """The invariants every output sequence keeps (issue 5 item 3): equal lengths; the first call's prompt is the
    prefix at mask 0; the mask-1 tokens are exactly the calls' completion ids in order, with their logprobs; 0.0
    logprobs where the mask is 0."""
    n = len(seq.input_ids)
    if len(seq.loss_mask) != n or (seq.logprobs is not None and len(seq.logprobs) != n):
        raise InvariantError(f"{seq.sequence_id}: column lengths differ")
    first = calls[seq.call_ids[0]].prompt
    if seq.prompt_len != len(first) or not np.array_equal(seq.input_ids[:len(first)], first) \
            or seq.loss_mask[:len(first)].any():
        raise InvariantError(f"{seq.sequence_id}: the first prompt is not the prefix at mask 0")
    sel = seq.loss_mask.astype(bool)
    comps = [calls[c].completion for c in seq.call_ids]
    if not np.array_equal(seq.input_ids[sel], np.concatenate(comps)):
        raise InvariantError(f"{seq.sequence_id}: mask-1 tokens are not the calls' completions in order")
    if seq.logprobs is not None:
        if seq.logprobs[~sel].any():
            raise InvariantError(f"{seq.sequence_id}: nonzero logprob at mask 0")
        lps = [calls[c].logprobs for c in seq.call_ids if len(calls[c].completion)]
        if lps and not np.array_equal(seq.logprobs[sel], np.concatenate(lps)):
            raise InvariantError(f"{seq.sequence_id}: logprobs are not the calls' sampled logprobs")


def _ends_with(arr: np.ndarray, eot: frozenset[int]) -> bool:
    return len(arr) > 0 and int(arr[-1]) in eot


def _first_eot(tail: np.ndarray, eot: frozenset[int]) -> int | None:
    if not len(tail):
        return None
    hit = (tail == next(iter(eot))) if len(eot) == 1 else np.isin(tail, np.fromiter(eot, dtype=np.int32))
    k = int(hit.argmax())
    return k if hit[k] else None


def merge_group(calls: list[Call], *, mode: str, eot_for: Callable[[str | None], frozenset[int] | None],
                on_mismatch: str = "merge", null_group: bool = False) -> GroupResult:
    """Turn one session group's calls (in (t_start, id) order) into sequences, per DESIGN §6.

    mode: prefix_merging or per_request. eot_for(model) gives the end-of-turn set E (rule 5); prefix_merging
    raises MissingEot when a chain needs E for a model that has none. null_group: the group of calls without a
    session, where every conversation is its own main chain (rule 2)."""
    res = GroupResult()
    session = None if null_group else (calls[0].session if calls else None)
    # Rule 1: only calls with non-null prompt and completion ids enter sequences.
    elig = [c for c in calls if c.eligible]
    routes = route_calls([c.prompt_bytes for c in elig])

    # Replay the routes into chains of current members; superseded calls are kept aside with their chain.
    members: list[list[int]] = []
    superseded: list[tuple[int, int]] = []  # (call position, chain)
    parent: list[int] = []  # union-find over chains: a diverged chain counts with the chain it left (rule 3, 9)
    diverged: dict[int, tuple[int, int]] = {}  # new chain → (chain it left, position)

    def root(c: int) -> int:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for i, r in enumerate(routes):
        if r.kind == "open":
            members.append([i])
            parent.append(r.chain)
            if r.diverged_from is not None:
                diverged[r.chain] = (r.diverged_from, r.diverged_pos or 0)
                parent[root(r.chain)] = root(r.diverged_from)
        elif r.kind == "join":
            members[r.chain].append(i)
        else:  # Rule 4: C replaces the chain's latest member; the replaced call becomes its own sequence.
            assert members[r.chain][-1] == r.replaced
            members[r.chain][-1] = i
            superseded.append((r.replaced, r.chain))
    res.n_chains = len(members)
    chain_ids = [elig[m[0]].id for m in members]

    # Rule 9: a session's main chain is the chain with the most calls (ties: the chain whose first call offered the
    # most tools — the agent loop offers its tools; titles, routers and memory extractors offer few or none —, then
    # the longest first prompt, then the earliest start); a diverged chain counts together with the chain it left,
    # and its first call is the lineage's earliest. In the null group every lineage is main.
    lineages: dict[int, list[int]] = {}
    for c in range(len(members)):
        lineages.setdefault(root(c), []).append(c)
    if null_group:
        main_roots = set(lineages)
    else:
        def rank(rt: int) -> tuple:
            cs = lineages[rt]
            n_calls = sum(len(members[c]) for c in cs)
            first = min((elig[members[c][0]] for c in cs), key=lambda x: (x.t_start, x.id))
            return (-n_calls, -first.n_tools, -len(first.prompt), first.t_start, first.id)
        main_roots = {min(lineages, key=rank)} if lineages else set()
    for rt, cs in lineages.items():
        if rt in main_roots:
            last_call = max((elig[i] for c in cs for i in members[c]), key=lambda x: (x.t_start, x.id))
            res.sft_calls.append(last_call)

    def note_turn(b: _Builder, call: Call, pos: int, chain_id: str, eot: frozenset[int] | None) -> None:
        """Rule 6: a turn without an end-of-turn id is truncated (finish `length`) or aborted (any other)."""
        if eot is None or _ends_with(call.completion, eot):
            return
        flag = "truncated_turn" if call.finish_reason == "length" else "aborted_turn"
        b.flags.add(flag)
        res.flag_notes.append(Note(session, chain_id, call.id, flag, pos + len(call.completion)))

    def eot_needed(model: str | None) -> frozenset[int]:
        e = eot_for(model)
        if not e:
            raise MissingEot(model)
        return e

    out: list[tuple[_Builder, int]] = []  # (builder, chain)
    for c, mem in enumerate(members):
        chain_id = chain_ids[c]
        first = elig[mem[0]]
        cause0 = None
        if c in diverged:
            cause0 = "prefix_diverged"
            left, pos = diverged[c]
            res.breaks.append(Note(session, chain_ids[left], first.id, "prefix_diverged", pos))
        if mode == "per_request":
            for j, i in enumerate(mem):
                b = _Builder(elig[i], chain_id, mode, cause0 if j == 0 else None)
                note_turn(b, elig[i], len(elig[i].prompt), chain_id, eot_for(elig[i].model))
                out.append((b, c))
            continue
        b = _Builder(first, chain_id, mode, cause0)
        for j in range(1, len(mem)):
            a, nxt = elig[mem[j - 1]], elig[mem[j]]
            eot = eot_needed(a.model)
            note_turn(b, a, len(a.prompt), chain_id, eot)
            cause = None
            interstitial = None
            if a.model != nxt.model:
                cause = "model_changed"
            else:
                # Rule 6: tail = P_B[len(P_A):], k = the first index of an id in E.
                tail = nxt.prompt[len(a.prompt):]
                k = _first_eot(tail, eot)
                if k is None:
                    cause = "no_eot_in_tail"
                else:
                    ends = _ends_with(a.completion, eot)
                    # A ended its turn itself: its EOT is in the sequence already, the interstitial follows it.
                    # Otherwise (length, abort, stop string) the template's EOT joins the interstitial at mask 0.
                    interstitial = tail[k + 1:] if ends else tail[k:]
                    body = a.completion[:-1] if ends else a.completion
                    # Rule 7: the template's rendering of A's turn differs from what A sampled.
                    if not np.array_equal(tail[:k], body):
                        res.flag_notes.append(Note(session, chain_id, nxt.id, "context_mismatch", len(a.prompt)))
                        if on_mismatch == "split":
                            cause = "context_mismatch"
                        else:
                            b.flags.add("context_mismatch")
            if cause is None:
                b.extend(interstitial, nxt)
            else:
                # Rule 8: the chain continues (B is its tip) but a new sequence starts at B with B's whole prompt
                # at mask 0; nothing is dropped.
                res.breaks.append(Note(session, chain_id, nxt.id, cause, len(a.prompt)))
                out.append((b, c))
                b = _Builder(nxt, chain_id, mode, cause)
                if cause == "context_mismatch":
                    b.flags.add("context_mismatch")
        last = elig[mem[-1]]
        note_turn(b, last, len(last.prompt), chain_id, eot_needed(last.model))
        out.append((b, c))
    for i, c in superseded:
        b = _Builder(elig[i], chain_ids[c], mode, None)
        b.flags.add("superseded")
        note_turn(b, elig[i], len(elig[i].prompt), chain_ids[c], eot_for(elig[i].model))
        res.flag_notes.append(Note(session, chain_ids[c], elig[i].id, "superseded", len(elig[i].prompt)))
        out.append((b, c))

    by_id = {c.id: c for c in elig}
    for b, c in out:
        seq = b.finish(session)
        check_sequence(seq, by_id)
        if root(c) not in main_roots:
            seq.side_chain = True
            seq.flags = [f for f in FLAGS if f in {*seq.flags, "side_chain"}]
        res.sequences.append(seq)
        for cid in seq.call_ids:
            res.placement[cid] = (seq.sequence_id, seq.chain_id)
    res.sequences.sort(key=lambda s: (s.t_first, s.sequence_id))
    return res
