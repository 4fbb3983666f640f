"""The report's session explorer: what report.html embeds for each session, and the one page around the overview.

The driver hands every group's products to `ViewerBuilder.add` in its order (fresh or carried over, whatever the
engine), so the page is the same for every engine and for `--incremental`. Per session it keeps a list row (the
explorer's filters and sort keys), a detail block (calls on a time line, chains, breaks, sequences and, unless
`--report-no-text`, the new messages of each call and its answer) and the sequences' token strips: every trainable
span and every break or flag position with CONTEXT tokens either side; the rest of a sequence is a collapsed count.

Sizes: the page must stay under `--report-max-mb`. Strips are the part that grows with tokens, so they are what is
left out: broken sessions and sessions with a problem flag keep theirs first, then sessions with informational
flags only, then the rest, each tier in the driver's order; the page says how many sessions lost their strips.

Safety: agent-controlled text (session ids, messages, tool arguments, token text) only ever travels as JSON inside
`<script type="application/json">` with `<`, `>`, `&`, U+2028 and U+2029 escaped (`script_json`), and the page's
script renders it with textContent / setAttribute only. A Content-Security-Policy allows the page's own script
(by hash) and nothing else: no network, no inline handlers.

Token text comes from `--vocab [MODEL=]DIR`: tokenizer.json's `model.vocab`, read here (byte-level BPE pieces are
mapped back through the GPT-2 byte alphabet to bytes, then shown as UTF-8). It is for the report only and never
touches the end-of-turn set."""

from __future__ import annotations

import base64
import hashlib
import html
import math
import os
from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import orjson

from polar.processor.eot import parse_tokenizer_arg
from polar.processor.load import InputError
from polar.processor.merge import BREAK_CAUSES, FLAGS

CONTEXT = 64  # tokens shown either side of a trainable span, a break or a flag
JOIN_GAP = 8  # windows closer than this are shown as one (a "… 3 tokens …" gap helps nobody)
TEXT_LIMIT = 2000  # characters of one message or answer kept in the page
NEW_MESSAGES = 24  # new messages of one call kept in the page (the rest are counted)
ROW_COLS = ("session", "group", "reward", "advantage", "calls", "errors", "sequences", "merge_ratio", "tokens",
            "trainable", "flags", "causes", "breaks", "protocols", "t_start", "seconds")
PROBLEM_FLAGS = frozenset(FLAGS) - {"side_chain", "constrained_decoding", "compaction"}  # informational flags keep a lower tier
PAGE_MB = 1_000_000  # --report-max-mb counts decimal megabytes
_TAG = len('<script type="application/json" id="polar-s-000000"></script>')


# ---------------------------------------------------------------------------------------------------- vocab

def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte ↔ unicode map, inverted: each printable stand-in character → the byte it stands for."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


_BYTE_OF = _byte_alphabet()


def piece_text(piece: str, byte_level: bool) -> str:
    """A vocabulary piece as display text: byte-level pieces back to bytes, shown as UTF-8 (a partial character
    as `\\xNN`); SentencePiece's `▁` as a space."""
    if not byte_level:
        return piece.replace("\u2581", " ")
    try:
        raw = bytes(_BYTE_OF[ch] for ch in piece)
    except KeyError:  # not a byte-level piece after all (an added token's own text)
        return piece
    return raw.decode("utf-8", errors="backslashreplace")


def _mentions_byte_level(node: object) -> bool:
    if isinstance(node, dict):
        return node.get("type") == "ByteLevel" or any(_mentions_byte_level(v) for v in node.values())
    if isinstance(node, list):
        return any(_mentions_byte_level(v) for v in node)
    return False


def read_vocab(path: str) -> dict[int, str]:
    """Token id → display text from a tokenizer.json (or a directory holding one): `model.vocab` (a piece → id map,
    or Unigram's [piece, score] list), then `added_tokens` over it."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    try:
        with open(file, "rb") as fh:
            doc = orjson.loads(fh.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise InputError(f"--vocab {path}: cannot read {file} ({exc})") from exc
    model = doc.get("model") if isinstance(doc, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, (dict, list)):
        raise InputError(f"--vocab {path}: {file} has no model.vocab")
    byte_level = _mentions_byte_level(doc.get("pre_tokenizer")) or _mentions_byte_level(doc.get("decoder"))
    pairs = vocab.items() if isinstance(vocab, dict) else ((p[0], i) for i, p in enumerate(vocab) if p)
    out = {int(i): piece_text(str(p), byte_level) for p, i in pairs if isinstance(i, int)}
    for tok in doc.get("added_tokens") or ():
        if isinstance(tok, dict) and isinstance(tok.get("id"), int) and isinstance(tok.get("content"), str):
            out[tok["id"]] = tok["content"]
    return out


@dataclass
class Vocabs:
    """`--vocab [MODEL=]DIR`: one vocabulary for every model (key "*") and/or one per `model_served`."""

    by_key: dict[str, dict[int, str]] = field(default_factory=dict)

    @classmethod
    def read(cls, specs: tuple[str, ...] | list[str]) -> Vocabs:
        out = cls()
        for spec in specs:
            model, directory = parse_tokenizer_arg(spec)
            out.by_key["*" if model is None else model] = read_vocab(directory)
        return out

    def key_for(self, model: str | None) -> str | None:
        """The vocabulary a sequence of `model` is shown with (None: ids only)."""
        if model is not None and model in self.by_key:
            return model
        return "*" if "*" in self.by_key else None


# ---------------------------------------------------------------------------------------------------- strips

def mask_spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) runs of 1s in a 0/1 mask."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], np.asarray(mask, dtype=np.int8), [0])))).tolist()
    return list(zip(edges[0::2], edges[1::2]))


def windows(n: int, mask: np.ndarray, marks: list[int], context: int = CONTEXT,
            spans: list[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """The [start, end) ranges a strip shows: every mask-1 run and every mark with `context` tokens either side,
    clipped to the sequence and joined when they overlap or nearly touch."""
    spans = mask_spans(mask) if spans is None else spans
    ranges = sorted([(max(0, a - context), min(n, b + context)) for a, b in spans]
                    + [(max(0, p - context), min(n, p + context)) for p in marks if 0 <= p <= n])
    out: list[list[int]] = []
    for a, b in ranges:
        if out and a <= out[-1][1] + JOIN_GAP:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out if b > a]


def encode_strip(ids: np.ndarray, mask: np.ndarray, logprobs: np.ndarray | None, marks: list[int]) -> dict:
    """A sequence's strip: `parts` = [start, ids, mask runs (starting with a run of 0s, possibly empty), logprobs in
    milli-nats of the mask-1 tokens (null when the sequence has none)] per shown window; the gaps between them are
    collapsed."""
    spans = mask_spans(mask)
    lp = None
    if logprobs is not None:  # milli-nats, -inf as -99 nats, NaN as 0
        x = np.clip(np.asarray(logprobs, dtype=np.float64), -99.0, 0.0)
        lp = np.rint(np.where(np.isnan(x), 0.0, x) * 1000).astype(np.int64)
    parts = []
    for a, b in windows(len(ids), mask, marks, spans=spans):
        runs: list[int] = []
        lps: list[int] | None = None if lp is None else []
        pos = a
        for sa, sb in spans:  # the windows hold whole spans: a span is either inside [a, b) or outside it
            if a <= sa < b:
                runs += [sa - pos, sb - sa]
                pos = sb
                if lps is not None:
                    lps += lp[sa:sb].tolist()
        if pos < b or not runs:
            runs.append(b - pos)
        parts.append([a, ids[a:b].tolist(), runs, lps])
    return {"n": len(ids), "parts": parts}


def strip_token_ids(strip: dict) -> np.ndarray:
    """The distinct token ids a strip shows (for the page's vocabulary block)."""
    if not strip["parts"]:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.concatenate([np.asarray(p[1], dtype=np.int64) for p in strip["parts"]]))


# ---------------------------------------------------------------------------------------------------- text

def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _clip(text: str, limit: int = TEXT_LIMIT) -> str:
    return text if len(text) <= limit else f"{text[:limit]} … ({len(text) - limit:,} more characters)"


def content_text(content: object) -> str:
    """An OpenAI chat message's content as plain text: strings as they are, text parts joined, other parts named."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, dict):
                out.append(f"[{part.get('type', 'part')}]")
        return "\n".join(out)
    return orjson.dumps(content, default=str).decode()


def _tool_calls(calls: object) -> list[list[str]]:
    out = []
    for c in calls if isinstance(calls, list) else ():
        f = c.get("function", c) if isinstance(c, dict) else {}
        args = f.get("arguments") if isinstance(f, dict) else None
        args = args if isinstance(args, str) else orjson.dumps(args, default=str).decode()
        out.append([str(f.get("name") if isinstance(f, dict) else ""), _clip(args)])
    return out


def _message(m: object) -> list:
    """[role, text, tool calls] of one upstream message."""
    if not isinstance(m, dict):
        return ["?", _clip(content_text(m)), []]
    return [str(m.get("role", "?")), _clip(content_text(m.get("content"))), _tool_calls(m.get("tool_calls"))]


def _loads(text: str | None) -> object:
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _new_messages(text: str | None, prev: list | None) -> tuple[int, list, list]:
    """(how many messages the previous call of the chain sent already, the new ones, this call's state) for a call
    whose messages JSON is `text`. State: [JSON, count, parsed list or None]. A call that repeats the previous one's
    JSON and adds to it is read from the addition only (a long conversation is not parsed again call after call)."""
    if prev is not None and text and prev[1]:
        head = prev[0]
        if text == head:
            return prev[1], [], prev
        if text.startswith(head[:-1]) and text[len(head) - 1:len(head)] == ",":
            tail = _loads("[" + text[len(head):])
            if isinstance(tail, list):
                return prev[1], tail, [text, prev[1] + len(tail), None]
    msgs = _loads(text)
    msgs = msgs if isinstance(msgs, list) else []
    old = [] if prev is None else (prev[2] if prev[2] is not None else _loads(prev[0]) or [])
    k = 0
    while k < min(len(old), len(msgs)) and old[k] == msgs[k]:
        k += 1
    return k, msgs[k:], [text or "[]", len(msgs), msgs]


def call_texts(rows: list[dict]) -> list[dict]:
    """Per call (rows in time order): the messages new since the previous call of its chain (all of them for a
    chain's first call; calls in no chain follow the session's previous call) and the answer it got, clipped."""
    last: dict[str | None, list] = {}
    out = []
    for row in rows:
        chain = row.get("chain_id")
        k, new, state = _new_messages(row.get("messages"), last.get(chain) if chain is not None else last.get(None))
        last[chain] = last[None] = state
        a = _loads(row.get("assistant"))
        a = a if isinstance(a, dict) else None
        out.append({
            "from": k, "new": [_message(m) for m in new[:NEW_MESSAGES]], "more": max(0, len(new) - NEW_MESSAGES),
            "out": None if a is None else [_clip(content_text(a.get("content"))),
                                           _clip(content_text(a.get("reasoning"))), _tool_calls(a.get("tool_calls"))],
        })
    return out


# ---------------------------------------------------------------------------------------------------- one session

def _error_text(error: str | None) -> str | None:
    e = _loads(error)
    if e is None:
        return None if error is None else _clip(error, 300)
    if isinstance(e, dict):
        head = " ".join(str(e[k]) for k in ("stage", "type", "status") if e.get(k) is not None)
        return _clip(f"{head}: {e.get('message', '')}".strip(": "), 300)
    return _clip(str(e), 300)


def _num(x: float | None, digits: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)


def _call_entries(rows: list[dict], seq_of: dict[str, int], t0: float) -> list[dict]:
    rel = lambda t: None if t is None else _num(t - t0)  # noqa: E731
    return [{"id": r["call_id"], "protocol": r.get("protocol"), "model": r.get("model_served"),
             "start": rel(r.get("t_start")), "first": rel(r.get("t_first_byte")), "end": rel(r.get("t_end")),
             "error": _error_text(r.get("error")), "finish": r.get("finish_reason"),
             "seq": seq_of.get(r["call_id"], -1), "chain": r.get("chain_id"),
             "p": r.get("prompt_tokens"), "c": r.get("completion_tokens"), "tools": r.get("n_tool_calls")}
            for r in rows]


def _notes(report) -> list:
    """The group's breaks and flag events, in the order the merge found them."""
    return [*((n, True) for n in report.breaks), *((n, False) for n in report.flag_notes)]


@dataclass
class SessionEntry:
    """What the page holds for one session: its list row, its detail block, its calls' text and its strips (JSON
    text; text "null" with --report-no-text), and its tier."""

    row: list
    detail: str
    text: str
    strips: str
    strip_ids: dict[str, np.ndarray]  # vocabulary key → the distinct ids its strips show
    tier: int  # 0: a break or a problem flag; 1: informational flags only; 2: neither
    sizes: tuple[int, int, int] = (0, 0, 0)  # UTF-8 bytes of detail, text, strips: the page budget counts bytes

    def __post_init__(self):
        self.sizes = tuple(map(_utf8_len, (self.detail, self.text, self.strips)))


def session_entry(prod, rewards, vocabs: Vocabs, with_text: bool, index: dict) -> SessionEntry:
    """One group's products → its SessionEntry. index: the builder's protocol and group lists (name → position)."""
    rows = sorted(prod.call_rows, key=lambda r: (r.get("t_start") is None, r.get("t_start") or 0.0, r["call_id"]))
    seqs = prod.sequences
    seq_of = {cid: i for i, s in enumerate(seqs) for cid in s.call_ids}
    pos_of = {r["call_id"]: j for j, r in enumerate(rows)}
    starts = [r["t_start"] for r in rows if r.get("t_start") is not None]
    ends = [r["t_end"] for r in rows if r.get("t_end") is not None]
    t0 = min(starts) if starts else 0.0
    notes = _notes(prod.report)
    seq_entries, strips, strip_ids = [], [], {}
    for i, s in enumerate(seqs):
        marks = [[n.token_pos, n.cause, is_break] for n, is_break in notes if n.call_id in s.call_ids
                 and (not is_break or n.call_id == s.sequence_id)]
        vk = vocabs.key_for(s.model)
        seq_entries.append({
            "id": s.sequence_id, "chain": s.chain_id, "calls": [pos_of.get(c, -1) for c in s.call_ids],
            "flags": list(s.flags), "cause": s.break_cause, "n": s.n_tokens, "tr": s.n_trainable,
            "pl": s.prompt_len, "reward": s.reward, "adv": _num(s.advantage, 4), "model": s.model,
            "side": bool(s.side_chain), "vk": vk, "marks": marks})
        strips.append(encode_strip(s.input_ids, s.loss_mask, s.logprobs, [m[0] for m in marks]))
        if vk is not None:
            strip_ids.setdefault(vk, []).append(strip_token_ids(strips[-1]))
    detail = {"session": prod.session, "t0": t0, "calls": _call_entries(rows, seq_of, t0), "seqs": seq_entries,
              "breaks": [{"chain": n.chain_id, "call": n.call_id, "cause": n.cause, "pos": n.token_pos,
                          "seq": seq_of.get(n.call_id, -1)} for n, is_break in notes if is_break]}
    row = _row(prod, rows, rewards, index, t0, ends)
    flags = {f for s in seqs for f in s.flags}
    broken = any(s.break_cause for s in seqs)
    tier = 0 if broken or flags & PROBLEM_FLAGS else (1 if flags else 2)
    text = script_json(call_texts(rows)) if with_text else "null"
    strip_ids = {k: np.unique(np.concatenate(v)) for k, v in strip_ids.items()}
    return SessionEntry(row, script_json(detail), text, script_json(strips), strip_ids, tier)


def _row(prod, rows: list[dict], rewards, index: dict, t0: float, ends: list[float]) -> list:
    """The explorer's row, in ROW_COLS order (flags, causes and protocols as bit sets over their lists)."""
    seqs, session = prod.sequences, prod.session
    hit = rewards.by_session.get(session) if session is not None else None
    group = hit[1] if hit else None
    flags = {f for s in seqs for f in s.flags}
    causes = [s.break_cause for s in seqs if s.break_cause]
    protocols = {r.get("protocol") or "(none)" for r in rows}
    bits = lambda names, order: sum(1 << order.index(x) for x in names if x in order)  # noqa: E731
    pbits = 0
    for p in protocols:
        pbits |= 1 << index["protocols"].setdefault(p, len(index["protocols"]))
    g = -1 if group is None else index["groups"].setdefault(group, len(index["groups"]))
    in_seqs = sum(len(s.call_ids) for s in seqs)
    return [session, g, hit[0] if hit else None, _num(rewards.advantage.get(session), 4) if hit else None,
            len(rows), sum(1 for r in rows if r.get("error") is not None), len(seqs),
            _num(in_seqs / len(seqs)) if seqs else None, sum(s.n_tokens for s in seqs),
            sum(s.n_trainable for s in seqs), bits(flags, FLAGS), bits(set(causes), BREAK_CAUSES), len(causes),
            pbits, _num(t0), _num(max(ends) - t0) if ends else None]


# ---------------------------------------------------------------------------------------------------- the builder

@dataclass
class ViewerData:
    """Every session's entry, and the choice of which keep their text and strips in the page (`fit`)."""

    entries: list[SessionEntry]
    protocols: list[str]
    groups: list[str]
    vocabs: Vocabs
    with_text: bool
    max_bytes: int
    keep: list[list[bool]] = field(default_factory=list)  # per entry: [its text, its strips] are in the page
    over: bool = False  # after `fit`: the page is past max_bytes even without any text or strip

    @property
    def text_calls(self) -> int:
        """Calls whose messages the page holds (0 with --report-no-text)."""
        n = ROW_COLS.index("calls")
        return sum(e.row[n] for e, k in zip(self.entries, self.kept(0)) if k) if self.with_text else 0

    @property
    def shows_token_text(self) -> bool:
        return self.with_text and bool(self.vocabs.by_key)

    def kept(self, part: int) -> list[bool]:
        """Per entry, whether its text (part 0) or its strips (part 1) are in the page (all, before `fit`)."""
        return [k[part] for k in self.keep] if self.keep else [True] * len(self.entries)

    def fit(self, room: int) -> None:
        """Choose what fits in `room` bytes (the page's other parts counted already): every detail block, then tier
        by tier a session's text and then its strips, each tier in the driver's order; a part that does not fit is
        left out and smaller ones after it may still go in."""
        used = sum(e.sizes[0] + _TAG for e in self.entries)
        self.over = used > room
        self.keep = [[False, False] for _ in self.entries]
        costs = self._vocab_costs() if self.shows_token_text else {}  # key → bytes of each id's vocabulary entry
        seen = {k: np.zeros(len(c), dtype=bool) for k, c in costs.items()}
        for i, part in sorted(((i, p) for i in range(len(self.entries)) for p in (0, 1)),
                              key=lambda x: (self.entries[x[0]].tier, x[1], x[0])):
            e = self.entries[i]
            new = {k: ids[~seen[k][ids]] for k, ids in e.strip_ids.items()} if part == 1 and costs else {}
            cost = e.sizes[1 + part] + _TAG + sum(int(costs[k][ids].sum()) for k, ids in new.items())
            if used + cost > room:
                continue
            used += cost
            self.keep[i][part] = True
            for k, ids in new.items():
                seen[k][ids] = True

    def _vocab_costs(self) -> dict[str, np.ndarray]:
        """Per vocabulary, indexed by token id: the bytes its entry takes in the page's vocabulary block (0 for ids
        no strip shows, or that the vocabulary lacks)."""
        out = {}
        for k, texts in self.vocabs.by_key.items():
            ids = [e.strip_ids[k] for e in self.entries if k in e.strip_ids]
            used = np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)
            cost = np.zeros(int(used.max()) + 1 if len(used) else 1, dtype=np.int64)
            for t in used.tolist():
                if t in texts:
                    cost[t] = len(str(t)) + _utf8_len(script_json(texts[t])) + 4  # "id":"text",
            out[k] = cost
        return out

    def left_out(self, part: int) -> int:
        """Sessions whose text (0) or strips (1) `fit` left out (sessions without any are not counted)."""
        empty = "null" if part == 0 else "[]"
        return sum(1 for e, k in zip(self.entries, self.kept(part)) if not k and (e.text, e.strips)[part] != empty)

    def index_json(self) -> str:
        return script_json({
            "cols": ROW_COLS, "rows": [e.row for e in self.entries], "flags": FLAGS, "causes": BREAK_CAUSES,
            "protocols": self.protocols, "groups": self.groups, "text": self.with_text,
            "vocab": self.shows_token_text, "context": CONTEXT, "max_mb": self.max_bytes / PAGE_MB,
            "strips": {"left_out": self.left_out(1), "shown": sum(self.kept(1))},
            "texts": {"left_out": self.left_out(0), "shown": sum(self.kept(0)) if self.with_text else 0}})

    def vocab_json(self) -> str:
        if not self.shows_token_text:
            return script_json({})
        shown: dict[str, list[np.ndarray]] = {}
        for e, keep in zip(self.entries, self.kept(1)):
            if keep:
                for k, ids in e.strip_ids.items():
                    shown.setdefault(k, []).append(ids)
        out = {}
        for k, arrays in shown.items():
            texts = self.vocabs.by_key[k]
            out[k] = {t: texts[t] for t in np.unique(np.concatenate(arrays)).tolist() if t in texts}
        return script_json(out)

    def blocks(self):
        """The per-session script elements, in session order: detail (s), text (x) and strips (t)."""
        for i, (e, (text, strips)) in enumerate(zip(self.entries, self.keep)):
            yield f'<script type="application/json" id="polar-s-{i}">{e.detail}</script>'
            if text and self.with_text:
                yield f'<script type="application/json" id="polar-x-{i}">{e.text}</script>'
            if strips:
                yield f'<script type="application/json" id="polar-t-{i}">{e.strips}</script>'


class ViewerBuilder:
    """Collects each group's SessionEntry in the driver's order."""

    def __init__(self, rewards, vocabs: Vocabs | None = None, with_text: bool = True, max_mb: float = 50):
        self.rewards, self.vocabs, self.with_text = rewards, vocabs or Vocabs(), with_text
        self.max_bytes = int(max_mb * PAGE_MB)
        self.index: dict[str, dict[str, int]] = {"protocols": {}, "groups": {}}
        self.entries: list[SessionEntry] = []

    def add(self, prod) -> None:
        self.entries.append(session_entry(prod, self.rewards, self.vocabs, self.with_text, self.index))

    def finish(self) -> ViewerData:
        return ViewerData(self.entries, list(self.index["protocols"]), list(self.index["groups"]), self.vocabs,
                          self.with_text, self.max_bytes)


# ---------------------------------------------------------------------------------------------------- the page

_ESCAPES = ((b"&", b"\\u0026"), (b"<", b"\\u003c"), (b">", b"\\u003e"), ("\u2028".encode(), b"\\u2028"),
            ("\u2029".encode(), b"\\u2029"))


def script_json(obj: object) -> str:
    """JSON that is safe inside <script type="application/json">: `<`, `>`, `&`, U+2028 and U+2029 as \\u escapes
    (they only occur inside strings, where the escape means the same)."""
    raw = orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=str)
    for a, b in _ESCAPES:
        raw = raw.replace(a, b)
    return raw.decode()


def asset(name: str) -> str:
    """The page's own script or style sheet (processor/viewer.js, processor/viewer.css)."""
    return resources.files("polar.processor").joinpath(name).read_text(encoding="utf-8")


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src 'none'; "
            "base-uri 'none'; form-action 'none'")


def holds_text(data: ViewerData | None) -> tuple[int, bool]:
    """(calls whose messages the page holds, whether it shows token text) after `fit`."""
    if data is None or not data.with_text:
        return 0, False
    return data.text_calls, data.shows_token_text and any(k and e.strip_ids for e, k in zip(data.entries, data.kept(1)))


def text_notice(data: ViewerData | None) -> str:
    """The sentence at the top of the page: does it hold conversation text?"""
    if data is not None and data.entries and not data.with_text:
        return ("This report contains no conversation text (--report-no-text): counts, ids, times and token ids "
                "only.")
    calls, tokens = holds_text(data)
    if not calls and not tokens:
        return "This report contains no conversation text."
    what = " and ".join(x for x in (f"the new messages and answers of {calls:,} calls" if calls else "",
                                    "token text (--vocab)" if tokens else "") if x)
    return (f"This report contains conversation text: {what}. Share it as you would the flow files; "
            "--report-no-text leaves it out.")


def strips_notice(data: ViewerData) -> str:
    """The sentence at the top of the page when strips (or text) were left out, and when even that was not enough."""
    strips, texts = data.left_out(1), data.left_out(0)
    if not strips and not texts:
        return ""
    limit = f"--report-max-mb {data.max_bytes / PAGE_MB:g}"
    what = f"Token strips of {strips:,}" + (f" and the conversation text of {texts:,}" if texts else "")
    text = (f"{what} of {len(data.entries):,} sessions were left out to keep this page under {limit} (broken and "
            "flagged sessions keep theirs first).")
    if data.over:
        text += f" The page is still over {limit}: its counts, calls and chains alone are larger."
    return f'<p id="strips-notice" class="notice">{html.escape(text)}</p>'


def _top(script: str, style: str, title: str, data: ViewerData | None) -> str:
    notice_cls = "notice text" if any(holds_text(data)) else "notice"
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_csp(script)}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>'
            f"<style>{style}</style></head><body>"
            f'<header id="top"><h1>{html.escape(title)}</h1>'
            f'<p id="text-notice" class="{notice_cls}">{html.escape(text_notice(data))}</p>'
            + (strips_notice(data) if data is not None and data.keep else ""))


def page(overview: str, data: ViewerData | None, title: str = "polar-process report") -> str:
    """The whole self-contained page: the overview (static HTML), the explorer's shells, the data, the script."""
    script, style = asset("viewer.js"), asset("viewer.css")
    rest = ('<nav id="tabs"><a href="#overview" data-tab="overview">Overview</a>'
            '<a href="#sessions" data-tab="sessions">Sessions</a>'
            '<a href="#session" data-tab="session" hidden>Session</a></nav></header><main>'
            f'<section id="view-overview" class="view">{overview}</section>'
            '<section id="view-sessions" class="view" hidden></section>'
            '<section id="view-session" class="view" hidden></section></main>'
            '<svg id="svg-ns" width="0" height="0" aria-hidden="true"></svg>')
    if data is None:
        return _top(script, style, title, None) + rest + f"<script>{script}</script></body></html>"
    data.keep = []
    fixed = sum(map(_utf8_len, (_top(script, style, title, data), rest, script, data.index_json())))
    data.fit(data.max_bytes - fixed - 1024)  # 1024: the tags around the blocks, the notice and the counts
    return "".join([_top(script, style, title, data), rest,
                    f'<script type="application/json" id="polar-index">{data.index_json()}</script>',
                    f'<script type="application/json" id="polar-vocab">{data.vocab_json()}</script>',
                    f"<script>{script}</script>", *data.blocks(), "</body></html>"])
