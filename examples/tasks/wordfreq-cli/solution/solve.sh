#!/usr/bin/env bash
# Reference solution of wordfreq-cli (cwd /app).
set -euo pipefail
cat > wordfreq.py <<'PY'
"""wordfreq: count the words in text files (or standard input), most frequent first."""

import argparse
import re
import sys
from collections import Counter

WORD = re.compile(r"[A-Za-z0-9]+")


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(prog="wordfreq", description="Count the words in text files.")
    parser.add_argument("files", nargs="*", metavar="FILE", help="files to read; none or - reads standard input")
    parser.add_argument("--top", type=positive_int, metavar="N", help="print only the N most frequent words")
    parser.add_argument("-i", "--ignore-case", action="store_true", help="lower-case words before counting")
    args = parser.parse_args(argv)
    counts = Counter()
    for name in args.files or ["-"]:
        try:
            text = sys.stdin.read() if name == "-" else open(name, encoding="utf-8", errors="replace").read()
        except OSError as exc:
            print(f"wordfreq: {name}: {exc.strerror}", file=sys.stderr)
            return 1
        words = WORD.findall(text)
        if args.ignore_case:
            words = [word.lower() for word in words]
        counts.update(words)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    for word, count in ranked[:args.top]:
        print(count, word)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
PY
