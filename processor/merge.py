"""Trajectory reconstruction for one session group: prefix_merging and per_request (docs/merge-rules.md rules 1–4, 6–9).

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

from polar.processor import compaction as compactions
from polar.processor.normalize import Call

FLAGS = ("context_mismatch", "missing_logprobs", "truncated_turn", "aborted_turn", "side_chain", "superseded",
         "constrained_decoding", "oversize", "mixed_weight_versions", "compaction")

# Break causes. prefix_diverged / no_eot_in_tail / context_mismatch come from the rules; model_changed is ours:
# one sequence is sampled by one model, so consecutive members served by different models start a new sequence.
BREAK_CAUSES = ("prefix_diverged", "no_eot_in_tail", "context_mismatch", "model_changed")

_HEAD = 64  # tokens in the routing index's bucket key
_HEAD_BYTES = _HEAD * 4


# ---------------------------------------------------------------------------------------------------- routing

@dataclass(frozen=True, slots=True)
class ChainAssignment:
    """Which chain one eligible call is assigned to, and how (routing's answer, rules 3–4). `kind`: join (rule 3),
    replace (rule 4) or open (a new chain)."""

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


def route_calls(prompts: Sequence[bytes]) -> list[ChainAssignment]:
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
    routes: list[ChainAssignment] = []

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
            routes.append(ChainAssignment("replace", c, replaced=last[c]))
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
            routes.append(ChainAssignment("join", joined))
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
        routes.append(ChainAssignment("open", n, diverged_from=best[2] if best else None,
                            diverged_pos=best[0] if best else None))
    return routes


def route_calls_naive(prompts: Sequence[list[int]]) -> list[ChainAssignment]:
    """Rules 3–4 read literally, on Python lists. The reference the index is tested against."""
    tips: list[list[int]] = []
    firsts: list[list[int]] = []
    last: list[int] = []
    routes: list[ChainAssignment] = []
    for i, p in enumerate(prompts):
        # Rule 4 (goes before rule 3): if P_C equals a tip exactly, C replaces that chain's latest member.
        equal = [c for c in range(len(tips)) if tips[c] == p]
        if equal:
            c = max(equal, key=lambda c: last[c])
            routes.append(ChainAssignment("replace", c, replaced=last[c]))
            last[c] = i
            continue
        # Rule 3: C extends T when len(T) < len(P_C) and P_C[:len(T)] == T; C joins the chain with the longest
        # tip it extends (ties: the tip whose call started last).
        ext = [c for c in range(len(tips)) if len(tips[c]) < len(p) and p[:len(tips[c])] == tips[c]]
        if ext:
            c = max(ext, key=lambda c: (len(tips[c]), last[c]))
            tips[c] = p
            last[c] = i
            routes.append(ChainAssignment("join", c))
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
        routes.append(ChainAssignment("open", len(tips) - 1, diverged_from=best[2] if best else None,
                            diverged_pos=best[0] if best else None))
    return routes


# ---------------------------------------------------------------------------------------------------- sequences

@dataclass
class TrainingSequence:
    """One training sequence: a row of sequences.parquet (and of batches/), before rewards are joined."""

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
    weight_versions: list[str] = field(default_factory=list)  # distinct, in call order; unknown versions left out
    call_spans: list[tuple[str, int, int]] = field(default_factory=list)  # (call_id, start, end): its completion
    advantages: np.ndarray | None = None  # per token, float32 (rewards.apply, rule 11); None: no advantage

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

    sequences: list[TrainingSequence] = field(default_factory=list)
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

    def finish(self, session: str | None) -> TrainingSequence:
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
        # One sequence sampled by more than one policy version: its logprobs are not all from one π_old.
        versions = list(dict.fromkeys(c.weight_version for c in self.calls if c.weight_version is not None))
        if len(versions) > 1:
            flags.add("mixed_weight_versions")
        first = self.calls[0]
        return TrainingSequence(
            sequence_id=first.id, chain_id=self.chain_id, session=session, mode=self.mode, input_ids=ids,
            loss_mask=mask, logprobs=lps, call_ids=[c.id for c in self.calls], prompt_len=len(first.prompt),
            flags=[f for f in FLAGS if f in flags], break_cause=self.break_cause, model=first.model,
            t_first=first.t_start, weight_versions=versions,
            call_spans=[(c.id, start, start + len(c.completion)) for start, c in self.spans],
        )


class InvariantError(AssertionError):
    """An output sequence broke an invariant: a bug in this module, never bad input."""


def check_sequence(seq: TrainingSequence, calls: dict[str, Call]) -> None:
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


@dataclass
class _Chains:
    """The routes replayed into chains: each chain's current members (positions among the eligible calls), the calls
    a retry replaced, and lineages — a diverged chain counts with the chain it left (rules 3, 9)."""

    members: list[list[int]] = field(default_factory=list)
    superseded: list[tuple[int, int]] = field(default_factory=list)  # (call position, chain)
    diverged: dict[int, tuple[int, int]] = field(default_factory=dict)  # new chain → (chain it left, position)
    parent: list[int] = field(default_factory=list)  # union-find over chains: one root per lineage

    @classmethod
    def replay(cls, routes: list[ChainAssignment]) -> _Chains:
        chains = cls()
        for i, r in enumerate(routes):
            if r.kind == "open":
                chains.members.append([i])
                chains.parent.append(r.chain)
                if r.diverged_from is not None:
                    chains.diverged[r.chain] = (r.diverged_from, r.diverged_pos or 0)
                    chains.parent[chains.root(r.chain)] = chains.root(r.diverged_from)
            elif r.kind == "join":
                chains.members[r.chain].append(i)
            else:  # Rule 4: C replaces the chain's latest member; the replaced call becomes its own sequence.
                assert chains.members[r.chain][-1] == r.replaced
                chains.members[r.chain][-1] = i
                chains.superseded.append((r.replaced, r.chain))
        return chains

    def join(self, later: int, earlier: int) -> None:
        """`later`'s lineage continues `earlier`'s (rule 12: the chain a compaction's summary opened)."""
        a, b = self.root(later), self.root(earlier)
        if a != b:
            self.parent[a] = b

    def root(self, c: int) -> int:
        parent = self.parent
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    def lineages(self) -> dict[int, list[int]]:
        """Each lineage's root chain → its chains, in chain order."""
        out: dict[int, list[int]] = {}
        for c in range(len(self.members)):
            out.setdefault(self.root(c), []).append(c)
        return out


def _main_lineages(chains: _Chains, elig: list[Call], null_group: bool) -> dict[int, list[int]]:
    """Rule 9: a session's main chain is the chain with the most calls (ties: the chain whose first call offered the
    most tools — the agent loop offers its tools; titles, routers and memory extractors offer few or none —, then
    the longest first prompt, then the earliest start); a diverged chain counts together with the chain it left,
    and its first call is the lineage's earliest. In the null group every lineage is main."""
    lineages = chains.lineages()
    if null_group or not lineages:
        return lineages

    def rank(rt: int) -> tuple:
        cs = lineages[rt]
        n_calls = sum(len(chains.members[c]) for c in cs)
        first = min((elig[chains.members[c][0]] for c in cs), key=lambda x: (x.t_start, x.id))
        return (-n_calls, -first.n_tools, -len(first.prompt), first.t_start, first.id)

    main = min(lineages, key=rank)
    return {main: lineages[main]}


class _ChainsToSequences:
    """Rules 6–8 over one group's chains: a builder per output sequence (`out`, with its chain), and the breaks and
    flag events recorded on the group's result."""

    def __init__(self, res: GroupResult, session: str | None, elig: list[Call], chain_ids: list[str], *, mode: str,
                 eot_for: Callable[[str | None], frozenset[int] | None], on_mismatch: str):
        self.res, self.session, self.elig, self.chain_ids = res, session, elig, chain_ids
        self.mode, self.eot_for, self.on_mismatch = mode, eot_for, on_mismatch
        self.out: list[tuple[_Builder, int]] = []  # (builder, chain)

    def _note_turn(self, b: _Builder, call: Call, chain_id: str, eot: frozenset[int] | None) -> None:
        """Rule 6: a turn without an end-of-turn id is truncated (finish `length`) or aborted (any other)."""
        if eot is None or _ends_with(call.completion, eot):
            return
        flag = "truncated_turn" if call.finish_reason == "length" else "aborted_turn"
        b.flags.add(flag)
        self.res.flag_notes.append(Note(self.session, chain_id, call.id, flag, len(call.prompt) + len(call.completion)))

    def _eot_needed(self, model: str | None) -> frozenset[int]:
        e = self.eot_for(model)
        if not e:
            raise MissingEot(model)
        return e

    def chain(self, c: int, members: list[int], diverged: tuple[int, int] | None) -> None:
        """One chain's sequences: one per call (per_request), or its members merged until a break."""
        cause0 = None
        if diverged is not None:
            cause0 = "prefix_diverged"
            left, pos = diverged
            self.res.breaks.append(Note(self.session, self.chain_ids[left], self.elig[members[0]].id,
                                        "prefix_diverged", pos))
        if self.mode == "per_request":
            for j, i in enumerate(members):
                call = self.elig[i]
                b = _Builder(call, self.chain_ids[c], self.mode, cause0 if j == 0 else None)
                self._note_turn(b, call, self.chain_ids[c], self.eot_for(call.model))
                self.out.append((b, c))
        else:
            self._merge(c, members, cause0)

    def _merge(self, c: int, members: list[int], cause0: str | None) -> None:
        chain_id = self.chain_ids[c]
        b = _Builder(self.elig[members[0]], chain_id, self.mode, cause0)
        for j in range(1, len(members)):
            a, nxt = self.elig[members[j - 1]], self.elig[members[j]]
            eot = self._eot_needed(a.model)
            self._note_turn(b, a, chain_id, eot)
            cause, interstitial = self._boundary(b, a, nxt, chain_id, eot)
            if cause is None:
                b.extend(interstitial, nxt)
                continue
            # Rule 8: the chain continues (B is its tip) but a new sequence starts at B with B's whole prompt at
            # mask 0; nothing is dropped.
            self.res.breaks.append(Note(self.session, chain_id, nxt.id, cause, len(a.prompt)))
            self.out.append((b, c))
            b = _Builder(nxt, chain_id, self.mode, cause)
            if cause == "context_mismatch":
                b.flags.add("context_mismatch")
        last = self.elig[members[-1]]
        self._note_turn(b, last, chain_id, self._eot_needed(last.model))
        self.out.append((b, c))

    def _boundary(self, b: _Builder, a: Call, nxt: Call, chain_id: str,
                  eot: frozenset[int]) -> tuple[str | None, np.ndarray | None]:
        """Between consecutive members A → B: the interstitial that joins B to the sequence, or the break cause."""
        if a.model != nxt.model:
            return "model_changed", None
        # Rule 6: tail = P_B[len(P_A):], k = the first index of an id in E.
        tail = nxt.prompt[len(a.prompt):]
        k = _first_eot(tail, eot)
        if k is None:
            return "no_eot_in_tail", None
        ends = _ends_with(a.completion, eot)
        # A ended its turn itself: its EOT is in the sequence already, the interstitial follows it.
        # Otherwise (length, abort, stop string) the template's EOT joins the interstitial at mask 0.
        interstitial = tail[k + 1:] if ends else tail[k:]
        body = a.completion[:-1] if ends else a.completion
        # Rule 7: the template's rendering of A's turn differs from what A sampled.
        if not np.array_equal(tail[:k], body):
            self.res.flag_notes.append(Note(self.session, chain_id, nxt.id, "context_mismatch", len(a.prompt)))
            if self.on_mismatch == "split":
                return "context_mismatch", None
            b.flags.add("context_mismatch")
        return None, interstitial

    def superseded(self, i: int, c: int) -> None:
        """Rule 4's replaced call: a sequence of its own, flagged superseded."""
        call, chain_id = self.elig[i], self.chain_ids[c]
        b = _Builder(call, chain_id, self.mode, None)
        b.flags.add("superseded")
        self._note_turn(b, call, chain_id, self.eot_for(call.model))
        self.res.flag_notes.append(Note(self.session, chain_id, call.id, "superseded", len(call.prompt)))
        self.out.append((b, c))


def merge_group(calls: list[Call], *, mode: str, eot_for: Callable[[str | None], frozenset[int] | None],
                on_mismatch: str = "merge", null_group: bool = False, compaction: str = "train") -> GroupResult:
    """Turn one session group's calls (in (t_start, id) order) into sequences, per docs/merge-rules.md.

    mode: prefix_merging or per_request. eot_for(model) gives the end-of-turn set E (rule 5); prefix_merging
    raises MissingEot when a chain needs E for a model that has none. null_group: the group of calls without a
    session, where every conversation is its own main chain (rule 2). compaction: what a compaction call's tokens
    become (rule 12: train, or mask)."""
    res = GroupResult()
    session = None if null_group else (calls[0].session if calls else None)
    # Rule 1: only calls with non-null prompt and completion ids enter sequences.
    elig = [c for c in calls if c.eligible]
    routes = route_calls([c.prompt_bytes for c in elig])
    chains = _Chains.replay(routes)
    summaries = {} if null_group else compactions.find(
        [c.completion for c in elig], [c.prompt for c in elig], [r.kind == "open" for r in routes])
    for x, b in summaries.items():  # rule 12: the conversation goes on after its summary
        chains.join(routes[b].chain, routes[x].chain)
    res.n_chains = len(chains.members)
    chain_ids = [elig[m[0]].id for m in chains.members]
    main = _main_lineages(chains, elig, null_group)
    for cs in main.values():  # SFT: the last call of each main chain
        res.sft_calls.append(max((elig[i] for c in cs for i in chains.members[c]), key=lambda x: (x.t_start, x.id)))

    build = _ChainsToSequences(res, session, elig, chain_ids, mode=mode, eot_for=eot_for, on_mismatch=on_mismatch)
    for c, members in enumerate(chains.members):
        build.chain(c, members, chains.diverged.get(c))
    for i, c in chains.superseded:
        build.superseded(i, c)

    by_id = {c.id: c for c in elig}
    for b, c in build.out:
        seq = b.finish(session)
        check_sequence(seq, by_id)
        _mark_compaction(res, seq, {elig[x].id for x in summaries}, compaction, by_id)
        if chains.root(c) not in main:
            seq.side_chain = True
            seq.flags = [f for f in FLAGS if f in {*seq.flags, "side_chain"}]
        res.sequences.append(seq)
        for cid in seq.call_ids:
            res.placement[cid] = (seq.sequence_id, seq.chain_id)
    res.sequences.sort(key=lambda s: (s.t_first, s.sequence_id))
    return res


def _mark_compaction(res: GroupResult, seq: TrainingSequence, summary_ids: set[str], mode: str,
                     by_id: dict[str, Call]) -> None:
    """Rule 12 on one sequence: a compaction call in it flags it and is noted; under `mask` its completion's tokens
    go to mask 0 (their logprobs to 0.0), so no loss reads them."""
    held = [span for span in seq.call_spans if span[0] in summary_ids]
    if not held:
        return
    seq.flags = [f for f in FLAGS if f in {*seq.flags, "compaction"}]
    for call_id, start, end in held:
        res.flag_notes.append(Note(seq.session, seq.chain_id, call_id, "compaction", len(by_id[call_id].prompt)))
        if mode == "mask":
            seq.loss_mask[start:end] = 0
            if seq.logprobs is not None:
                seq.logprobs[start:end] = 0.0
