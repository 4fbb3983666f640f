"""What a run tells its user, as calls on one object instead of prints: notes, warnings and errors on stderr as
`polar-rollout: …` lines, the processor's lines as they are, the progress stream, and the summary on stdout. The
command line's Reporter writes to the process's own streams (looked up at each write); `polar-rollout serve` gives
each run one that writes to the run's log and keeps its errors as data for the response."""

from __future__ import annotations

import sys
import traceback
from typing import TextIO

PREFIX = "polar-rollout: "


class Reporter:
    def __init__(self, err: TextIO | None = None, out: TextIO | None = None):
        self._err, self._out = err, out
        self.errors: list[str] = []  # every error reported, in order (the serve's response takes the last)

    @property
    def err(self) -> TextIO:
        """The stream of the run's lines and its progress (the process's stderr unless given one)."""
        return self._err or sys.stderr

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    def note(self, text: str) -> None:
        print(PREFIX + text, file=self.err, flush=True)

    def warn(self, text: str) -> None:
        self.note(f"warning: {text}")

    def error(self, text: str) -> None:
        """The run's refusal or failure, one line naming the fix: remembered, and printed."""
        self.errors.append(text)
        self.note(f"error: {text}")

    def line(self, text: str) -> None:
        """A line of another program's (polar-process's stderr), as it is."""
        print(text, file=self.err, flush=True)

    def summary(self, lines: list[str]) -> None:
        print("\n".join(lines), file=self.out, flush=True)

    def exception(self) -> None:
        """The traceback of the exception being handled (a bug's, which must not take a serve down)."""
        traceback.print_exc(file=self.err)
        self.err.flush()
