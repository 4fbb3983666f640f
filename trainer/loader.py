"""Micro-batches for a trainer from the processor's `batches/` (docs/architecture.md#the-trainer-side).

`micro_batches(batches_dir, max_tokens, layout)` reads every `batches/*.parquet` row and yields torch tensors:
- `per_sequence` (the CPU default): rows sorted by length (longest first) and right-padded to the longest row of
  their micro-batch, with an attention mask; rows × longest ≤ max_tokens.
- `packed`: sequences concatenated into one row (first-fit decreasing, Σ n_tokens ≤ max_tokens), `position_ids`
  restarting at 0 for each sequence and no attention mask (transformers builds the block-diagonal mask from the
  resets; CPU has no varlen kernel, so a pack still pays its whole length squared in attention).
Every tensor is token-aligned: position t holds token t, its loss mask, its recorded logprob (π_old) and its
advantage — the row's per-token `advantages` column (docs/merge-rules.md rule 11), or, in a file written before that
column (OUT version < 2), the row's `advantage` broadcast over its tokens, which is what the column holds under
`polar-process --credit session`. Token 0 of every sequence is never trainable (it has no context).

Rows are left out, and counted, when their advantage is null (no reward joined) or their logprobs are null
(`missing_logprobs`: no π_old). A sequence longer than max_tokens is its own micro-batch (a note says so), never cut.
Calls not sampled at T=1/top_p=1/top_k=-1 under `raw_logprobs` (when calls.parquet or the call's flow record says so)
and constrained calls (tool_choice required/named, a JSON schema: vLLM's logprobs are after the grammar mask) have
their completion tokens masked out, and counted: their recorded logprobs are not the policy's π_old. A row left with
no trainable token is left out (counted): a forward for nothing.

With a `Staleness` rule (polar-train --max-staleness), each row's staleness — the current version minus the oldest
version among its calls — rides with its tokens (`MicroBatch.staleness`), and rows staler than its limit are left out
(`left_out_stale`).

Which call a token belongs to comes from `call_spans` when sequences carry it; otherwise from the trainable runs of
the loss mask matched, in order, to the calls' completion lengths (`calls.parquet`). A sequence whose runs do not
match has unknown spans (`spans=None`).
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass, field

import numpy as np
import orjson
import polars as pl
import torch

from polar.records import out as out_tables

LAYOUTS = ("per_sequence", "packed")
PINNED_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
RAW_LOGPROBS = "raw_logprobs"
_CALL_COLUMNS = ("temperature", "top_p", "top_k", "logprobs_mode", "weight_version", "constrained")


# ---------------------------------------------------------------------------------------------------- calls

@dataclass(frozen=True)
class CallInfo:
    """What a trainer needs to know about one call. None = unknown (neither calls.parquet nor the record says)."""

    call_id: str
    completion_tokens: int | None = None
    weight_version: str | None = None
    constrained: bool | None = None
    sampling: dict = field(default_factory=dict)  # temperature, top_p, top_k, logprobs_mode as known

    @property
    def off_policy_sampling(self) -> str | None:
        """Why this call's recorded logprobs are not raw log-softmax at T=1 (e.g. `temperature=0.7`), or None."""
        for key, want in PINNED_SAMPLING.items():
            got = self.sampling.get(key)
            if got is None:
                continue
            if key == "top_k" and got in (0, -1):  # vLLM: both disable top-k
                continue
            if float(got) != float(want):
                return f"{key}={got:g}"
        mode = self.sampling.get("logprobs_mode")
        if mode is not None and mode != RAW_LOGPROBS:
            return f"logprobs_mode={mode}"
        return None


def _record_fields(rec: dict) -> dict:
    """The call fields a flow record holds: sampling as sent, `constrained` (older records: the one rule applied to
    `upstream_request`), `weight_version`."""
    from polar import records

    sampling = rec.get("sampling") or {}
    constrained = rec.get("constrained")
    if constrained is None and rec.get("upstream_request"):
        try:
            constrained = records.is_constrained(orjson.loads(rec["upstream_request"]))
        except ValueError:
            constrained = None
    out = {k: sampling.get(k) for k in ("temperature", "top_p", "top_k", "logprobs_mode")}
    out.update(constrained=constrained, weight_version=rec.get("weight_version"))
    return out


class _Records:
    """Flow records by (file, offset): positioned reads (`polar.records.RecordFiles`), each file opened once."""

    def __init__(self):
        from polar import records

        self._errors = (OSError, *records.RECORD_ERRORS)  # SchemaError is a ValueError
        self._files = records.RecordFiles()

    def fields(self, path: str | None, offset: int | None) -> dict:
        """{} when the record cannot be read (a moved or rewritten flow file: the fields stay unknown)."""
        if not path or offset is None:
            return {}
        try:
            return _record_fields(self._files.read(path, int(offset)))
        except self._errors:
            return {}

    def close(self) -> None:
        self._files.close()


def read_calls(out_dir: str) -> dict[str, CallInfo]:
    """OUT/calls.parquet as CallInfo by call id ({} without the file). Columns calls.parquet lacks (sampling,
    constrained, weight_version) are read from each call's flow record (`source_file`/`source_offset`)."""
    path = os.path.join(out_dir, "calls.parquet")
    if not os.path.isfile(path):
        return {}
    have = out_tables.read_schema(path)
    cols = ["call_id"] + [c for c in ("completion_tokens", "source_file", "source_offset", *_CALL_COLUMNS) if c in have]
    missing = [c for c in _CALL_COLUMNS if c not in have]
    out, records = {}, _Records()
    try:
        for row in pl.read_parquet(path, columns=cols).iter_rows(named=True):
            if missing:
                rec = records.fields(row.get("source_file"), row.get("source_offset"))
                row.update({c: rec.get(c) for c in missing})
            out[row["call_id"]] = CallInfo(
                call_id=row["call_id"], completion_tokens=row.get("completion_tokens"),
                weight_version=row.get("weight_version"), constrained=row.get("constrained"),
                sampling={k: row.get(k) for k in ("temperature", "top_p", "top_k", "logprobs_mode")})
    finally:
        records.close()
    return out


def completion_spans(row: dict, mask: np.ndarray, calls: dict[str, CallInfo]) -> list[tuple[str, int, int]] | None:
    """Each call's completion span [start, end) in the sequence: `call_spans` when the row has it, else the
    trainable runs of the mask matched in order to the calls with a completion; None when they do not match."""
    spans = row.get("call_spans")
    if spans:
        return [(s["call_id"], int(s["start"]), int(s["end"])) for s in spans]
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    runs = list(zip(edges[::2].tolist(), edges[1::2].tolist()))
    ids = list(row.get("call_ids") or [])
    lengths = [calls[c].completion_tokens if c in calls else None for c in ids]
    with_tokens = [(c, n) for c, n in zip(ids, lengths) if n != 0]
    if len(with_tokens) != len(runs):
        return None
    if any(n is not None and n != e - s for (_, n), (s, e) in zip(with_tokens, runs)):
        return None
    return [(c, s, e) for (c, _), (s, e) in zip(with_tokens, runs)]


# ---------------------------------------------------------------------------------------------------- rows

@dataclass
class SequenceTokens:
    """One sequence as numpy arrays. `loss_mask` is what the consumer trains or checks (1 = this token)."""

    sequence_id: str
    input_ids: np.ndarray  # int64
    loss_mask: np.ndarray  # float32
    logprobs: np.ndarray  # float32 (zeros when the row has none)
    advantage: float = 0.0
    staleness: int | None = None  # versions behind the policy being trained (Staleness); None: not known
    session: str | None = None  # the session (rollout) the row belongs to; None: not known
    advantages: np.ndarray | None = None  # float32 per token (the advantages column); None: `advantage` everywhere

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)


def read_rows(paths: list[str]) -> pl.DataFrame:
    """The rows of these sequences/batches parquet files, in file order (polar.records.out: their version checked)."""
    frames = [out_tables.read(p) for p in paths]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def row_arrays(df: pl.DataFrame) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray | None]]:
    """(input_ids int64, loss_mask float32, logprobs float32 or None) per row, through flat buffers (no Python lists
    per token)."""
    lens = df["input_ids"].list.len().to_numpy()
    cuts = np.cumsum(lens)[:-1]
    ids = np.split(df["input_ids"].explode().to_numpy().astype(np.int64), cuts) if len(df) else []
    mask = np.split(df["loss_mask"].explode().to_numpy().astype(np.float32), cuts) if len(df) else []
    has = df["logprobs"].is_not_null().to_numpy()
    flat = df.filter(pl.Series(has))["logprobs"].explode().to_numpy().astype(np.float32)
    parts = iter(np.split(flat, np.cumsum(lens[has])[:-1]) if has.any() else [])
    lps = [next(parts) if h else None for h in has]
    return ids, mask, lps


def token_advantages(df: pl.DataFrame) -> list[np.ndarray | None]:
    """Each row's per-token advantages (float32), through one flat buffer; None for a row without them (a file
    older than the column, or a null advantage)."""
    if "advantages" not in df.columns or not len(df):
        return [None] * len(df)
    has = df["advantages"].is_not_null().to_numpy()
    # a null row's length is null, which would make the lengths floats (NaN): counted as 0, then left out by `has`
    lens = df["advantages"].list.len().fill_null(0).to_numpy().astype(np.int64)[has]
    flat = df.filter(pl.Series(has))["advantages"].explode().to_numpy().astype(np.float32)
    parts = iter(np.split(flat, np.cumsum(lens)[:-1]) if has.any() else [])
    return [next(parts) if h else None for h in has]


@dataclass
class Selection:
    """The rows the loader keeps, and what it left out."""

    sequences: list[SequenceTokens]
    counts: dict[str, int]
    notes: list[str]
    stalenesses: list[int] = field(default_factory=list)  # every row's known staleness, left-out rows included


def call_reasons(row: dict, calls: dict[str, CallInfo], leave_out_constrained: bool) -> dict[str, str]:
    """{call_id: why its tokens are left out}: `sampling` (not T=1/top_p=1/top_k=-1 under raw_logprobs) or
    `constrained` (its recorded logprobs are after the grammar mask, not the policy's; unknown per call: the row's
    `constrained_decoding` flag)."""
    out = {}
    flagged = "constrained_decoding" in (row.get("flags") or [])
    for c in row.get("call_ids") or []:
        info = calls.get(c)
        if info is not None and info.off_policy_sampling:
            out[c] = "sampling"
        elif leave_out_constrained and (flagged if info is None or info.constrained is None else info.constrained):
            out[c] = "constrained"
    return out


def _mask_calls(row: dict, recorded: np.ndarray, mask: np.ndarray, reasons: dict[str, str],
                calls: dict[str, CallInfo], counts: dict[str, int]) -> None:
    """Mask out the completion tokens of the calls in `reasons` (the whole row's when the spans are unknown)."""
    spans = completion_spans(row, recorded, calls)
    if spans is None:
        counts["unknown_spans"] += 1
        spans = [(next(iter(reasons)), 0, len(mask))]
    for c, s, e in spans:
        if c in reasons:
            counts[f"{reasons[c]}_calls_left_out"] += 1
            counts[f"{reasons[c]}_tokens_left_out"] += int(mask[s:e].sum())
            mask[s:e] = 0


def trainable_mask(row: dict, recorded: np.ndarray, calls: dict[str, CallInfo], counts: dict[str, int],
                   leave_out_constrained: bool = True) -> np.ndarray:
    """A copy of the row's recorded loss mask with token 0 and the completion tokens of the calls `call_reasons`
    names masked out, counted into `counts` (the keys of COUNTS)."""
    mask = recorded.copy()
    mask[:1] = 0
    reasons = call_reasons(row, calls, leave_out_constrained)
    if reasons:
        _mask_calls(row, recorded, mask, reasons, calls, counts)
    return mask


@dataclass(frozen=True)
class Staleness:
    """A row's staleness = `current` − the oldest version among its calls, as `index` numbers them (an
    asynchronous trainer trains on samples some of whose calls an older policy sampled). Rows past `limit` are left
    out (`left_out_stale`); a row none of whose calls has a known version keeps `staleness` None (counted in
    `staleness_unknown`)."""

    current: int
    index: object  # Callable[[str | None], int | None]: a weight version's number, None when it has none
    limit: int | None = None

    def of(self, row: dict, calls: dict[str, CallInfo]) -> int | None:
        known = [self.index(calls[c].weight_version) for c in row.get("call_ids") or [] if c in calls]
        known = [v for v in known if v is not None]
        return self.current - min(known) if known else None


COUNTS = ("rows", "left_out_null_advantage", "left_out_missing_logprobs", "left_out_flagged",
          "left_out_no_trainable", "sampling_calls_left_out", "sampling_tokens_left_out",
          "constrained_calls_left_out", "constrained_tokens_left_out", "unknown_spans", "left_out_stale",
          "staleness_unknown")
_ROW_NOTES = (("left_out_null_advantage", "null advantage (no reward joined)"),
              ("left_out_stale", "staler than the limit"),
              ("left_out_missing_logprobs", "no logprobs (missing_logprobs)"),
              ("left_out_flagged", "flagged (leave_out_flags)"),
              ("left_out_no_trainable", "no trainable token left"))


def _keep(row: dict, has_logprobs: bool, leave_out_flags: tuple[str, ...]) -> str | None:
    """The count a row is left out under, or None to keep it."""
    if row.get("advantage") is None or not math.isfinite(row["advantage"]):
        return "left_out_null_advantage"
    if not has_logprobs:
        return "left_out_missing_logprobs"
    if set(row.get("flags") or []) & set(leave_out_flags):
        return "left_out_flagged"
    return None


def select_rows(df: pl.DataFrame, calls: dict[str, CallInfo], *, leave_out_constrained: bool = True,
                leave_out_flags: tuple[str, ...] = (), staleness: Staleness | None = None) -> Selection:
    """Rows with an advantage and logprobs (and none of `leave_out_flags`, and not staler than `staleness.limit`),
    each with token 0 and the completion tokens of calls not sampled at T=1/top_p=1/top_k=-1 under raw_logprobs, and
    of constrained calls, masked out; everything left out is counted."""
    counts = dict.fromkeys(COUNTS, 0)
    counts["rows"] = len(df)
    kept, seen = [], []
    ids, masks, lps = row_arrays(df) if len(df) else ([], [], [])
    advs = token_advantages(df)
    for i, row in enumerate(df.drop("input_ids", "loss_mask", "logprobs", "advantages", strict=False)
                            .iter_rows(named=True)):
        why = _keep(row, lps[i] is not None, leave_out_flags)
        stale = staleness.of(row, calls) if staleness is not None else None
        if staleness is not None and stale is None:
            counts["staleness_unknown"] += 1
        elif stale is not None and why is None:
            seen.append(stale)
        if why is None and stale is not None and staleness.limit is not None and stale > staleness.limit:
            why = "left_out_stale"
        mask = trainable_mask(row, masks[i], calls, counts, leave_out_constrained) if why is None else masks[i]
        if why is None and not mask.any():
            why = "left_out_no_trainable"
        if why is not None:
            counts[why] += 1
            continue
        kept.append(SequenceTokens(row["sequence_id"], ids[i], mask, lps[i], float(row["advantage"]), stale,
                                   row.get("session"), advs[i]))
    notes = [f"{counts[k]} row(s) left out: {what}" for k, what in _ROW_NOTES if counts[k]]
    for reason, what in (("sampling", "not sampled at T=1/top_p=1/top_k=-1 under raw_logprobs"),
                         ("constrained", "constrained (logprobs after the grammar mask)")):
        if counts[f"{reason}_calls_left_out"]:
            notes.append(f"{counts[f'{reason}_calls_left_out']} call(s) {what}: their "
                         f"{counts[f'{reason}_tokens_left_out']} token(s) masked out")
    return Selection(kept, counts, notes, seen)


# ---------------------------------------------------------------------------------------------------- batches

@dataclass
class MicroBatch:
    """Token-aligned tensors [B, L]: position t holds token t, its loss mask, π_old(token t) and the advantage.

    `segments[k] = (row, start, end)` places `sequence_ids[k]` (of session `sessions[k]`) in the tensors.
    per_sequence has `attention_mask` (1 = real token); packed has B = 1 and `attention_mask` None, `position_ids`
    restarting per sequence."""

    layout: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    sequence_ids: list[str]
    segments: list[tuple[int, int, int]]
    staleness: torch.Tensor | None = None  # [B, L] int64: each token's row's staleness; −1 unknown or padding
    sessions: list[str | None] = field(default_factory=list)  # sessions[k]: the session of sequence_ids[k]

    @property
    def n_tokens(self) -> int:
        """Real tokens (padding not counted)."""
        return sum(e - s for _, s, e in self.segments)

    @property
    def n_trainable(self) -> int:
        return int(self.loss_mask.sum().item())

    def model_inputs(self) -> dict:
        """Keyword arguments for the model's forward (recompute.token_logprobs)."""
        if self.layout == "packed":
            return {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": None}
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "position_ids": None}


def group_indices(lengths: list[int], max_tokens: int, layout: str) -> list[list[int]]:
    """Indices into `lengths` per micro-batch. per_sequence: longest first, next-fit while rows × longest ≤
    max_tokens; packed: first-fit decreasing on Σ length ≤ max_tokens. A row over max_tokens is alone."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    if layout == "per_sequence":
        for i in order:
            if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups
    room: list[int] = []
    for i in order:
        n = lengths[i]
        slot = next((k for k, r in enumerate(room) if n <= r), None)
        if slot is None:
            groups.append([i])
            room.append(max_tokens - n)
        else:
            groups[slot].append(i)
            room[slot] -= n
    return groups


def build(seqs: list[SequenceTokens], layout: str) -> MicroBatch:
    """One micro-batch of `seqs` in `layout`."""
    rows = [[s] for s in seqs] if layout == "per_sequence" else [seqs]
    width = max(sum(s.n_tokens for s in r) for r in rows)
    shape = (len(rows), width)
    ids, pos = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    att, mask = np.zeros(shape, np.int64), np.zeros(shape, np.float32)
    old, adv = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    stale = np.full(shape, -1, np.int64)
    segments = []
    for b, row in enumerate(rows):
        at = 0
        for s in row:
            end = at + s.n_tokens
            ids[b, at:end], pos[b, at:end], att[b, at:end] = s.input_ids, np.arange(s.n_tokens), 1
            mask[b, at:end], old[b, at:end] = s.loss_mask, s.logprobs
            adv[b, at:end] = s.advantage if s.advantages is None else s.advantages
            mask[b, at] = 0  # token 0 of a sequence has no context
            stale[b, at:end] = -1 if s.staleness is None else s.staleness
            segments.append((b, at, end))
            at = end
    t = torch.from_numpy
    return MicroBatch(layout, t(ids), t(att) if layout == "per_sequence" else None, t(pos), t(mask), t(old),
                      t(adv * (mask > 0)), [s.sequence_id for s in seqs], segments, t(stale),
                      [s.session for s in seqs])


class MicroBatches:
    """The micro-batches of a selection (iterable; `len()` micro-batches), with `counts` and `notes`."""

    def __init__(self, selection: Selection, max_tokens: int, layout: str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}: use one of {', '.join(LAYOUTS)}")
        if max_tokens < 1:
            raise ValueError("max_tokens must be ≥ 1")
        self.layout, self.max_tokens = layout, max_tokens
        seqs = selection.sequences
        self.groups = [[seqs[i] for i in g] for g in group_indices([s.n_tokens for s in seqs], max_tokens, layout)]
        self.notes = list(selection.notes)
        self.stalenesses = list(selection.stalenesses)
        over = [s for s in seqs if s.n_tokens > max_tokens]
        for s in over:
            self.notes.append(f"sequence {s.sequence_id} has {s.n_tokens} tokens > max_tokens {max_tokens}: "
                              "its own micro-batch (not truncated)")
        self.counts = dict(selection.counts, sequences=len(seqs), micro_batches=len(self.groups), oversize=len(over),
                           tokens_forward=sum(s.n_tokens for s in seqs),
                           tokens_trainable=int(sum(float(s.loss_mask[1:].sum()) for s in seqs)))

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self):
        for g in self.groups:
            yield build(g, self.layout)


def batch_files(batches_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(batches_dir, "*.parquet")))


def micro_batches(batches_dir: str, max_tokens: int, layout: str = "per_sequence", *,
                  calls: dict[str, CallInfo] | None = None, leave_out_constrained: bool = True,
                  leave_out_flags: tuple[str, ...] = (), staleness: Staleness | None = None) -> MicroBatches:
    """The micro-batches of every row in `batches_dir/*.parquet` (see the module docstring). `calls` defaults to
    the calls.parquet beside `batches_dir` (OUT/batches → OUT/calls.parquet); `leave_out_constrained=False`
    trains constrained calls' tokens too; rows with any of `leave_out_flags` (e.g. context_mismatch) are left out."""
    if calls is None:
        calls = read_calls(os.path.dirname(os.path.abspath(batches_dir)))
    rows = select_rows(read_rows(batch_files(batches_dir)), calls, leave_out_constrained=leave_out_constrained,
                       leave_out_flags=leave_out_flags, staleness=staleness)
    return MicroBatches(rows, max_tokens, layout)
