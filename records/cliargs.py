"""Every command's argument errors are one line and exit 2 (issue 37): `PROG: error: MESSAGE (see PROG --help)` on
stderr, not argparse's usage block, with the option a typo meant named (`--ouput` → "did you mean --out?") and the
choice a mistyped value meant. Here, at the bottom floor, so every command's parser can share it. Standard library
only.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys


def nearest(word: str, candidates, cutoff: float = 0.6) -> str | None:
    """The candidate a mistyped `word` most likely meant (a prefix of one wins), or None."""
    candidates = list(candidates)
    starts = [c for c in candidates if c.startswith(word) and len(word) >= 3]
    if len(starts) == 1:
        return starts[0]
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=cutoff)
    return close[0] if close else None


class OneLineParser(argparse.ArgumentParser):
    """`error` prints one line and exits 2; with `raises`, the line goes to that exception instead (a command that
    reports its errors itself). Sub-parsers (`add_subparsers`) are of the same class."""

    def __init__(self, *args, raises: type[Exception] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.raises = raises

    def options(self) -> list[str]:
        """Its --options and its sub-commands' (a sub-command's unknown flag is reported by the parent)."""
        out = [s for s in self._option_string_actions if s.startswith("--")]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    out += [s for s in sub._option_string_actions if s.startswith("--") and s not in out]
        return out

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)  # what error() looks for typos in
        return super().parse_known_args(args, namespace)

    def _unknown_flags(self) -> list[str]:
        """The --flags of the command line that are no option of this parser (nor an abbreviation of one)."""
        out = []
        for word in getattr(self, "_argv", []):
            if word == "--":
                break
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and len(flag) > 2 and flag not in self.options() and \
                    not any(o.startswith(flag) for o in self.options()):
                out.append(flag)
        return out

    def hint(self, message: str) -> str:
        """The message with "did you mean …?" where a typo has a near option or choice."""
        hints = []
        for flag in self._unknown_flags():
            near = nearest(flag, self.options())
            hints.append(f"{flag}: did you mean {near}?" if near else f"{flag}: no such option")
        if hints and not message.startswith("unrecognized arguments"):
            message = f"{message}; unrecognized arguments: {' '.join(self._unknown_flags())}"
        if hints:
            return f"{message} ({'; '.join(hints)})"
        m = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = [c.strip().strip("'") for c in m.group(3).split(",")]
            near = nearest(m.group(2), choices)
            if near:
                return f"{message} (did you mean {near}?)"
        return message

    def error(self, message: str):
        line = f"{self.hint(message)} (see {self.prog} --help)"
        if self.raises is not None:
            raise self.raises(line)
        print(f"{self.prog}: error: {line}", file=sys.stderr)
        sys.exit(2)


def positive_int(text: str) -> int:
    """An argparse type: an integer above 0 (the error names what was given)."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value
