"""One row per sample of a processed polar-rollout RUN, as a trainer that takes one completion per sample wants it
(TRL's `rollout_func`; verl's AgentLoopOutput has the same shape): the ids the sampler saw, split at the first
call's prompt, the recorded logprobs, and a mask of the tokens the model sampled.

A sample's row is built from the sequence that holds its session's last call (the one the reward judges). A session
processed into several sequences (a compaction, a side chain, a prefix break) has the others left out and named
(`RunRows.left_out`), never silently. A sample with no sequence (an infra_error, an agent that died before its
first call) is one pad token with mask 0 and no reward, counted. The mask is the trainer loader's
(`polar.trainer.loader.trainable_mask`): the completion tokens of constrained calls and of calls not sampled at
T=1/top_p=1/top_k=-1 under raw_logprobs are masked and counted, as polar-train masks them; a `context_mismatch`
sequence (its recorded logprobs were sampled under another context) is masked whole and counted.

The latest attempt of a sample is the one with the highest `attempt` (the rollout ledger's rule).

A row carries no advantage (the trainer computes one per completion from the reward), so an OUT processed with
`polar-process --credit turn` (per-call advantages; OUT/manifest.json's `credit`) is refused in one line
(`RowsError`) rather than trained as session credit without a word."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from polar.records import out as out_tables
from polar.records.results import read_latest
from polar.trainer.loader import COUNTS, read_calls, row_arrays, trainable_mask

MISMATCH = "context_mismatch"


class RowsError(ValueError):
    """A RUN whose rows would lose what it was processed for: str() is one line naming the fix."""


@dataclass
class SampleRow:
    """One sample, one completion. `prompt_ids` + `completion_ids` is the session's sequence, id for id."""

    task: str
    k: int
    status: str | None
    reward: float | None
    session: str | None
    sequence_id: str | None
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # per completion token: the sampler's, 0.0 where the model did not sample
    env_mask: list[int]  # per completion token: 1 = trained (sampled by the model, and its logprob is π_old)
    weight_version: str | None  # the versions that sampled the sequence, comma-joined in call order

    @property
    def trainable(self) -> int:
        return sum(self.env_mask)


@dataclass
class RunRows:
    rows: dict[tuple[str, int], SampleRow]
    left_out: list[str] = field(default_factory=list)  # sequence ids of other sequences of a sample's session
    counts: dict[str, int] = field(default_factory=dict)


def latest_results(run: Path) -> dict[tuple[str, int], dict]:
    """results.jsonl's latest attempt per (task, k): the highest `attempt` (polar.records.results, the one reader)."""
    return read_latest(run / "results.jsonl")


def _last_calls(out: Path) -> dict[str, str]:
    """{session: the id of its last call} (the latest t_start) from OUT/calls.parquet."""
    path = out_tables.CALLS.path(out)
    if not Path(path).is_file():
        return {}
    df = out_tables.read(path, columns=["call_id", "session", "t_start"]).drop_nulls("session")
    last = df.sort(["session", "t_start", "call_id"]).group_by("session", maintain_order=True).last()
    return dict(zip(last["session"].to_list(), last["call_id"].to_list()))


def read_rows(run: Path, pad_id: int) -> RunRows:
    """Every sample of the RUN (its latest attempt) as a SampleRow."""
    results = latest_results(run)
    out = run / "out"
    _refuse_turn_credit(out)
    counts = dict.fromkeys(COUNTS, 0)
    counts.update(no_sequence=0, unrewarded=0, mismatch_masked=0)
    sequences = out_tables.SEQUENCES.path(out)
    seqs = out_tables.read(sequences) if Path(sequences).is_file() else pl.DataFrame()
    calls = read_calls(str(out)) if len(seqs) else {}
    last = _last_calls(out) if len(seqs) else {}
    by_session: dict[str, list[int]] = {}
    if len(seqs):
        for i, session in enumerate(seqs["session"].to_list()):
            by_session.setdefault(session, []).append(i)
        ids, masks, lps = row_arrays(seqs)
        meta = seqs.drop("input_ids", "loss_mask", "logprobs").to_dicts()
    rows: dict[tuple[str, int], SampleRow] = {}
    left_out: list[str] = []
    for (task, k), res in sorted(results.items()):
        reward = res.get("reward")
        if reward is None:
            counts["unrewarded"] += 1
        session = res.get("session")
        found = by_session.get(session, [])
        if not found:
            counts["no_sequence"] += 1
            rows[(task, k)] = SampleRow(task, k, res.get("status"), reward, session, None, [pad_id], [pad_id], [0.0],
                                        [0], None)
            continue
        chosen = _holding(found, meta, last.get(session))
        left_out += [meta[i]["sequence_id"] for i in found if i != chosen]
        rows[(task, k)] = _row(task, k, res, meta[chosen], ids[chosen], masks[chosen], lps[chosen], calls, counts,
                               pad_id)
    counts["sequences_left_out"] = len(left_out)
    return RunRows(rows, left_out, counts)


def _refuse_turn_credit(out: Path) -> None:
    manifest = out / "manifest.json"
    credit = json.loads(manifest.read_text()).get("credit") if manifest.is_file() else None
    if credit == "turn":
        raise RowsError(f"{out} was processed with polar-process --credit turn: a row takes one advantage per "
                        "completion, so per-call credit cannot reach it; reprocess with --credit session, or train "
                        "with polar-train (or export verl / prime-rl)")


def _holding(found: list[int], meta: list[dict], last_call: str | None) -> int:
    """The index of the sequence holding the session's last call (the last sequence when that is not known)."""
    for i in found:
        if last_call is not None and last_call in (meta[i].get("call_ids") or []):
            return i
    return found[-1]


def _row(task: str, k: int, res: dict, row: dict, ids: np.ndarray, mask: np.ndarray, lps: np.ndarray | None,
         calls: dict, counts: dict, pad_id: int) -> SampleRow:
    cut = int(row["prompt_len"])
    if lps is None:
        counts["left_out_missing_logprobs"] += 1
        lps, trained = np.zeros(len(ids), np.float32), np.zeros(len(ids), np.float32)
    elif MISMATCH in (row.get("flags") or []):
        counts["mismatch_masked"] += 1
        trained = np.zeros(len(ids), np.float32)
    else:
        trained = trainable_mask(row, mask, calls, counts)
    lps = np.where(mask > 0, lps, 0.0)  # the sampler's logprob where the model sampled, 0.0 elsewhere
    completion, env, logprobs = ids[cut:].tolist(), trained[cut:].astype(np.int64).tolist(), lps[cut:].tolist()
    if not completion:  # the last call sampled nothing: TRL needs a token to hold the row
        completion, env, logprobs = [pad_id], [0], [0.0]
    versions = row.get("weight_versions") or []
    return SampleRow(task, k, res.get("status"), res.get("reward"), res.get("session"), row["sequence_id"],
                     ids[:cut].tolist(), completion, [float(x) for x in logprobs], env,
                     ",".join(versions) if versions else None)
