"""Credit per turn (docs/merge-rules.md rule 11, `--credit session|turn`, `--turn-gamma`): each token's advantage.

Under `session` every trained token of a sequence carries the sequence's advantage (rule 10's scalar). Under `turn`
a session's boundary calls (its main chain's calls, in order, as the rollout scored them: `turn_scores`) add to it
the progress their actions made: the state score's change from one boundary to the next, summed forward with
`--turn-gamma` (return-to-go), taken relative to the group's mean at the same boundary index over *every* scored
session of the group — a session that already stopped counts there with zero progress, so no session's baseline
depends on when it chose to stop (verl #7244's bias) — and divided by that index's σ under `--advantage-norm std`.

Pure functions of numbers; the processor calls `turn_terms` once over the rewards file and `token_advantages` per
sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CREDITS = ("session", "turn")
DEFAULT_TURN_GAMMA = 0.5
MIN_SCORED = 2  # scored sessions a group needs for a per-index baseline; fewer: session credit, counted


class TurnScoresError(ValueError):
    """A `turn_scores` value that is not the documented shape: str() says what is wrong (the reader adds where)."""


@dataclass(frozen=True)
class TurnScores:
    """A session's state scores: `scores[k]` when boundary call `calls[k]` arrived (the state its earlier actions
    left), `final` after the session ended. Every score in [0, 1]."""

    calls: tuple[str, ...]
    scores: tuple[float, ...]
    final: float

    def progress(self) -> list[float]:
        """d_k = s_{k+1} − s_k: what the actions answering boundary call k changed (s_{n+1} = final)."""
        after = (*self.scores[1:], self.final)
        return [b - a for a, b in zip(self.scores, after)]


def _score(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise TurnScoresError(f"{what} must be a number in [0, 1], got {value!r}")
    return float(value)


def parse_turn_scores(value) -> TurnScores | None:
    """`turn_scores` of a reward line: null (unscored), or {"calls": [{"call_id": str, "score": x}, ...], "final": x}
    with the boundary calls in order and each score in [0, 1]."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("calls"), list) or "final" not in value:
        raise TurnScoresError('turn_scores must be null or {"calls": [{"call_id": str, "score": number}, ...], '
                              '"final": number}')
    calls, scores = [], []
    for i, item in enumerate(value["calls"]):
        if not isinstance(item, dict) or not isinstance(item.get("call_id"), str):
            raise TurnScoresError(f'turn_scores.calls[{i}] must be {{"call_id": str, "score": number}}')
        calls.append(item["call_id"])
        scores.append(_score(item.get("score"), f"turn_scores.calls[{i}].score"))
    if len(set(calls)) != len(calls):
        raise TurnScoresError("turn_scores.calls names a call twice")
    return TurnScores(tuple(calls), tuple(scores), _score(value["final"], "turn_scores.final"))


def returns(ts: TurnScores, gamma: float) -> list[float]:
    """G_k = Σ_{j ≥ k} γ^{j−k} d_j: call k's own progress plus later calls' progress smeared back by γ per call."""
    out: list[float] = []
    acc = 0.0
    for d in reversed(ts.progress()):
        acc = d + gamma * acc
        out.append(acc)
    return out[::-1]


@dataclass
class TurnCredit:
    """`turn_terms`' answer: session → {boundary call id → its turn term}; and the sessions that fell back to session
    credit (null turn_scores, or a group with fewer than MIN_SCORED scored sessions)."""

    terms: dict[str, dict[str, float]]
    fallback: int = 0


def turn_terms(scores: dict[str, TurnScores | None], groups: dict[str, str | None], gamma: float,
               norm: str = "std") -> TurnCredit:
    """Rule 11's turn term of every boundary call. `scores`: each rewarded session's turn scores (None: unscored);
    `groups`: each session's group (None: no group, so no advantage at all: left alone, not counted).

    Per group over its scored sessions i (m ≥ MIN_SCORED of them) and index k = 1 … max n_i: G_k^i = returns()[k],
    or 0 when session i stopped before boundary k (its state is final: no more progress). b_k and σ_k = the mean and
    population σ of G_k over all m; term_k^i = (G_k^i − b_k) / σ_k (std; 0 when σ_k = 0) or G_k^i − b_k (mean)."""
    members: dict[str, list[str]] = {}
    fallback = 0
    for session, group in groups.items():
        if group is None:
            continue
        if scores.get(session) is None:
            fallback += 1
        else:
            members.setdefault(group, []).append(session)
    terms: dict[str, dict[str, float]] = {}
    for sessions in members.values():
        if len(sessions) < MIN_SCORED:
            fallback += len(sessions)
            continue
        rets = {s: returns(scores[s], gamma) for s in sessions}
        depth = max(len(r) for r in rets.values())
        for s in sessions:
            terms[s] = {}
        for k in range(depth):
            g = [rets[s][k] if k < len(rets[s]) else 0.0 for s in sessions]
            mean = math.fsum(g) / len(g)
            sigma = math.sqrt(math.fsum((x - mean) ** 2 for x in g) / len(g))
            for s, x in zip(sessions, g):
                if k < len(rets[s]):
                    centred = x - mean
                    terms[s][scores[s].calls[k]] = (0.0 if sigma == 0 else centred / sigma) if norm == "std" \
                        else centred
    return TurnCredit(terms, fallback)


def token_advantages(advantage: float | None, loss_mask: np.ndarray, call_spans: list[tuple[str, int, int]],
                     terms: dict[str, float] | None = None) -> np.ndarray | None:
    """A sequence's per-token advantages (Float32, aligned with input_ids): `advantage` on trained tokens, plus the
    turn term of the call whose completion holds them when `terms` names it; 0.0 on untrained tokens. None when
    the sequence has no advantage."""
    if advantage is None:
        return None
    out = np.zeros(len(loss_mask), dtype=np.float64)
    out[loss_mask.astype(bool)] = advantage
    for call_id, start, end in call_spans if terms else ():
        term = terms.get(call_id)
        if term:
            out[start:end] += term  # spans lie on trained tokens only: untrained ones stay a plain 0.0
    return out.astype(np.float32)
