"""The trainer's command lines share one argparse rule: a bad argument is one line naming the fix, exit 2 — not
argparse's usage block. polar-train, polar-verify and polar-export build their parsers from `OneLineParser`."""

from __future__ import annotations

import sys

from polar.records import cliargs


class OneLineParser(cliargs.OneLineParser):
    """`error` prints `PROG: MESSAGE (see PROG --help)` on stderr and exits 2, a typo's nearest option named; with
    `raises`, the message goes to that exception instead (polar-export reports its errors itself)."""

    def error(self, message: str):
        line = f"{self.hint(message)} (see {self.prog} --help)"
        if self.raises is not None:
            raise self.raises(line)
        print(f"{self.prog}: {line}", file=sys.stderr)
        sys.exit(2)
