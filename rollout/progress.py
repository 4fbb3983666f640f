"""Progress on stderr: samples done/total, mean reward, statuses, ETA — a bar on a terminal, one line per sample
otherwise."""

from __future__ import annotations

import sys
import time

from polar.rollout.ledger import REWARDED, ResultRow


class Progress:
    """samples done/total, mean reward, statuses, ETA — a bar on a terminal, one line per sample otherwise."""

    def __init__(self, total: int, enabled: bool | None, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if enabled is None else enabled
        self.total, self.done = total, 0
        self.statuses: dict[str, int] = {}
        self.rewards: list[float] = []
        self.running = 0
        self.t0 = time.monotonic()
        self._drawn = 0.0

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * 24)
        mean = f"{sum(self.rewards) / len(self.rewards):.3f}" if self.rewards else "-"
        elapsed = time.monotonic() - self.t0
        eta = (elapsed / self.done * (self.total - self.done)) if self.done else None
        sts = " ".join(f"{s} {n}" for s, n in sorted(self.statuses.items()))
        run = f" · {self.running} running" if self.running else ""
        return (f"[{bar:<24}] {self.done}/{self.total} samples{run} · mean reward {mean} · {sts or '-'} · "
                f"{_duration(elapsed)} · ETA {_duration(eta) if eta is not None else '?'}")

    def tick(self, running: int) -> None:
        """Redraw the bar (a terminal only) at most once a second: the running count and the clock move."""
        self.running = running
        if self.tty and time.monotonic() - self._drawn >= 1.0:
            self._drawn = time.monotonic()
            self.stream.write(f"\r{self.line()}\033[K")
            self.stream.flush()

    def count(self, status: str | None, reward: float | None) -> None:
        """A sample's final status (and reward) in the tallies (one the run resumed with, or one that just ended)."""
        s = status or "?"
        self.statuses[s] = self.statuses.get(s, 0) + 1
        if reward is not None and s in REWARDED:
            self.rewards.append(reward)

    def update(self, row: ResultRow) -> None:
        self.done += 1
        self.running = max(0, self.running - 1)
        self.count(row.status, row.reward)
        s = row.status or "?"
        if self.tty:
            self.stream.write(f"\r{self.line()}\033[K")
        else:
            reward = "-" if row.reward is None else f"{row.reward:g}"
            err = f" ({row.error[:160]})" if row.error and s not in ("completed",) else ""
            self.stream.write(f"polar-rollout: {row.task}/{row.k}/{row.attempt}: {s}, reward "
                              f"{reward}{err} — {self.line()}\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
