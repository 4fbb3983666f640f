"""Evaluation estimators over a rollout run's samples, as pure functions (standard library only): pass@k, the
resolved rate and its interval.

- A sample counts when it has a reward; one without (an infra, verifier or cancelled status) is left out of its task's
  n and counted as `unrewarded`. A counted sample is resolved when its reward.json says `resolved` (SWE tasks), else
  when its reward is 1.
- pass@k of one task with n counted samples, c of them resolved, is the unbiased estimator 1 − C(n−c, k) / C(n, k)
  (the chance that k of the n samples drawn without replacement hold a resolved one); defined for k ≤ n. A run's
  pass@k is the mean over the tasks with n ≥ k (null when none has).
- `resolved_rate` is the mean over tasks of each task's resolved share, which is pass@1: every task weighs the same,
  however many of its samples were rewarded.
- `resolved_ci95` is a percentile bootstrap over tasks: tasks are drawn with replacement, each with all its samples,
  since one task's samples share its difficulty and are not independent draws; 2,000 rounds from a fixed seed, so a
  summary is reproducible.
"""

from __future__ import annotations

import math
import random
from typing import Iterable, Mapping, Sequence

BOOTSTRAP_ROUNDS = 2000
BOOTSTRAP_SEED = 0


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 − C(n−c, k) / C(n, k): the chance that k of n samples (c resolved) drawn without replacement hold one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def task_pass_at(n: int, c: int, top_k: int) -> dict[str, float]:
    """One task's pass@k for every k ≤ min(top_k, n), keyed by str(k)."""
    return {str(k): pass_at_k(n, c, k) for k in range(1, min(top_k, n) + 1)}


def pass_at(counts: Mapping[str, tuple[int, int]], top_k: int) -> dict[str, float | None]:
    """A run's pass@k for every k ≤ top_k: the mean over the tasks with n ≥ k (counts: task → (n, c))."""
    out: dict[str, float | None] = {}
    for k in range(1, top_k + 1):
        values = [pass_at_k(n, c, k) for n, c in counts.values() if n >= k]
        out[str(k)] = math.fsum(values) / len(values) if values else None
    return out


def bootstrap_ci(rates: Sequence[float], level: float = 0.95, rounds: int = BOOTSTRAP_ROUNDS,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """The percentile interval of the mean of `rates` (one per task) under resampling of tasks; None without tasks."""
    if not rates:
        return None
    rng = random.Random(seed)
    t = len(rates)
    means = sorted(math.fsum(rates[rng.randrange(t)] for _ in range(t)) / t for _ in range(rounds))
    tail = (1.0 - level) / 2
    return means[math.floor(tail * rounds)], means[math.ceil((1.0 - tail) * rounds) - 1]


def is_resolved(reward: float, details: object) -> bool:
    """A counted sample's outcome: reward.json's `resolved` when it holds a bool, else reward == 1."""
    if isinstance(details, dict) and isinstance(details.get("resolved"), bool):
        return details["resolved"]
    return reward == 1.0


def evaluation(outcomes: Mapping[str, Iterable[bool | None]], top_k: int) -> dict:
    """The summary's evaluation block from each task's sample outcomes (True resolved, False not, None no reward):
    `resolved_rate`, `resolved_ci95`, `pass_at` and `unrewarded` overall, and per task n, resolved, unrewarded and
    pass_at."""
    counts: dict[str, tuple[int, int]] = {}
    per_task: dict[str, dict] = {}
    unrewarded = 0
    for task, got in outcomes.items():
        got = list(got)
        n, c, left = sum(g is not None for g in got), sum(g is True for g in got), sum(g is None for g in got)
        unrewarded += left
        per_task[task] = {"n": n, "resolved": c, "unrewarded": left, "resolved_rate": c / n if n else None,
                          "pass_at": task_pass_at(n, c, top_k)}
        if n:
            counts[task] = (n, c)
    rates = [c / n for n, c in counts.values()]
    ci = bootstrap_ci(rates)
    return {"resolved_rate": math.fsum(rates) / len(rates) if rates else None,
            "resolved_ci95": list(ci) if ci is not None else None, "pass_at": pass_at(counts, top_k),
            "tasks_counted": len(counts), "unrewarded": unrewarded, "per_task": per_task}
