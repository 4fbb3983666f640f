"""Rewards join, GRPO advantages (rule 10, `--advantage-norm`) and the side-chain policy (rule 9, `--side-chains`).

Rewards are read before any session is loaded, so every session's advantage is known when its sequences are
written (the group statistics need only the rewards file and the set of sessions in the index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import orjson

from polar.processor import credit
from polar.processor.merge import TrainingSequence


UNMATCHED_NAMED = 10  # unmatched sessions named in the report and the warning; the rest are counted
# --advantage-norm: std = (r − mean_g) / σ_g (GRPO; TRL's scale_rewards="group" but for its ddof 1 and + 1e-4);
# mean = r − mean_g (Dr. GRPO; TRL's scale_rewards="none"): a tiny group's σ no longer scales a reward gap up
ADVANTAGE_NORMS = ("std", "mean")


class RewardsError(ValueError):
    """A rewards file the processor cannot use (bad line, duplicate session): the CLI exits 2."""


@dataclass
class Rewards:
    """Session → (reward, group), plus what the join saw."""

    by_session: dict[str, tuple[float, str | None]] = field(default_factory=dict)
    advantage: dict[str, float | None] = field(default_factory=dict)
    unmatched_lines: int = 0  # lines naming a session that is not in the dump
    unmatched_sessions: list[str] = field(default_factory=list)  # the first UNMATCHED_NAMED of those sessions
    missing: int = 0  # sessions in the dump without a reward line
    turn_scores: dict[str, credit.TurnScores | None] = field(default_factory=dict)  # the lines' turn_scores
    turn: credit.TurnCredit | None = None  # --credit turn's terms (credit.turn_terms); None: session credit
    carried: dict[str, dict] = field(default_factory=dict)  # the lines' CARRIED keys, for sft.jsonl's rows

    @property
    def joined(self) -> int:
        return len(self.by_session)

    def group_of(self, session: str | None) -> str | None:
        hit = self.by_session.get(session) if session is not None else None
        return hit[1] if hit else None


def read_rewards(path: str | None, sessions: set[str], norm: str = "std") -> Rewards:
    """Parse JSONL `{"session": str, "reward": float, "group": str|null}` and join it to the dump's sessions.

    Duplicate session lines are an error; lines for unknown sessions are counted, not used, and the first
    UNMATCHED_NAMED of them named (a typo in a session id should be seen, not only counted)."""
    out = Rewards()
    if path is None:
        out.missing = len(sessions)
        return out
    seen: set[str] = set()
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise RewardsError(f"--rewards {path}: {exc.strerror}") from exc
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise RewardsError(f"{path}:{n}: not JSON ({exc})") from exc
            if not isinstance(obj, dict) or not isinstance(obj.get("session"), str):
                raise RewardsError(f'{path}:{n}: expected {{"session": str, "reward": float, "group": str|null}}')
            session, reward, group = obj["session"], obj.get("reward"), obj.get("group")
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise RewardsError(f"{path}:{n}: reward must be a finite number, got {reward!r}")
            if group is not None and not isinstance(group, str):
                raise RewardsError(f"{path}:{n}: group must be a string or null, got {group!r}")
            if session in seen:
                raise RewardsError(f"{path}:{n}: duplicate reward line for session {session!r}")
            try:
                turns = credit.parse_turn_scores(obj.get("turn_scores"))
            except credit.TurnScoresError as exc:
                raise RewardsError(f"{path}:{n}: {exc}") from None
            seen.add(session)
            if session not in sessions:
                out.unmatched_lines += 1
                if len(out.unmatched_sessions) < UNMATCHED_NAMED:
                    out.unmatched_sessions.append(session)
                continue
            out.by_session[session] = (float(reward), group)
            out.turn_scores[session] = turns
            out.carried[session] = carried_fields(obj, f"{path}:{n}")
    out.missing = len(sessions - out.by_session.keys())
    out.advantage = advantages(out.by_session, norm)
    return out


# What a reward line may carry into sft.jsonl's rows (polar-rollout writes them for SWE tasks): the agent's patch
# against the base commit, and whether the verifier counted the sample resolved.
CARRIED = {"patch": str, "resolved": bool}


def carried_fields(line: dict, where: str) -> dict:
    """A reward line's CARRIED keys that are set (null is absent); a value of another type is a RewardsError."""
    out = {}
    for key, kind in CARRIED.items():
        value = line.get(key)
        if value is not None and not isinstance(value, kind):
            raise RewardsError(f"{where}: {key} must be a {kind.__name__} or null, got {type(value).__name__}")
        if value is not None:
            out[key] = value
    return out


def with_carried(sft_lines: list[bytes], rewards: Rewards, session: str | None) -> list[bytes]:
    """A session's sft.jsonl rows with its reward line's carried keys added (the rows as they are without any)."""
    extra = rewards.carried.get(session) if session is not None else None
    if not extra:
        return sft_lines
    return [orjson.dumps({**orjson.loads(line), **extra}) + b"\n" for line in sft_lines]


def check_joined(path: str, rewards: Rewards, sessions) -> None:
    """A rewards file with lines of which none joins a session of the dump is a mistake (session ids from another
    run, or a prefix missing): RewardsError naming one line's session and one of the dump's, so the fix is seen."""
    if rewards.joined or not rewards.unmatched_lines:
        return
    ours = next((s for s in sessions if s is not None), None)
    raise RewardsError(f"--rewards {path}: none of its {rewards.unmatched_lines} line(s) joins a session of the "
                       f"dump (it names {rewards.unmatched_sessions[0]!r}; the dump has e.g. {ours!r}); check the "
                       f"session ids, or pass --allow-unjoined to process without rewards")


def advantages(by_session: dict[str, tuple[float, str | None]], norm: str = "std") -> dict[str, float | None]:
    """Rule 10: per group g over its rewarded sessions, (r − mean_g) / σ_g with population σ (ddof 0) under `norm`
    std, r − mean_g under mean; 0.0 when σ_g = 0 or |g| = 1. A rewarded session without a group gets a null
    advantage."""
    if norm not in ADVANTAGE_NORMS:
        raise ValueError(f"advantage norm {norm!r}: one of {', '.join(ADVANTAGE_NORMS)}")
    groups: dict[str, list[str]] = {}
    out: dict[str, float | None] = {}
    for session, (_, group) in by_session.items():
        if group is None:
            out[session] = None
        else:
            groups.setdefault(group, []).append(session)
    for members in groups.values():
        rs = [by_session[s][0] for s in members]
        mean = math.fsum(rs) / len(rs)
        sigma = math.sqrt(math.fsum((r - mean) ** 2 for r in rs) / len(rs))
        for s, r in zip(members, rs):
            out[s] = 0.0 if sigma == 0 or len(rs) == 1 else (r - mean) / (sigma if norm == "std" else 1.0)
    return out


def apply(seq: TrainingSequence, rewards: Rewards, side_chains: str) -> None:
    """Set a sequence's group, reward and advantage. Sessions without reward: both null.

    Side chains (rule 9): include = the session's values; zero = reward 0.0 and advantage 0.0 (null where the
    session's is null); exclude = both null (and the sequence is left out of batches/)."""
    hit = rewards.by_session.get(seq.session) if seq.session is not None else None
    seq.group = hit[1] if hit else None
    if hit is None:
        seq.reward = seq.advantage = None
        return
    side = seq.side_chain and "compaction" not in seq.flags  # rule 12: a summary is the session's, never a side call
    if side and side_chains == "exclude":
        seq.reward = seq.advantage = None
    elif side and side_chains == "zero":
        seq.reward = 0.0
        seq.advantage = None if rewards.advantage.get(seq.session) is None else 0.0
    else:
        seq.reward, seq.advantage = hit[0], rewards.advantage.get(seq.session)
    # Per token (rule 11): the scalar on trained tokens, plus a main-chain call's turn term under --credit turn.
    terms = rewards.turn.terms.get(seq.session) if rewards.turn and not seq.side_chain else None
    seq.advantages = credit.token_advantages(seq.advantage, seq.loss_mask, seq.call_spans, terms)
