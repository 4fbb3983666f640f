"""wordfreq: count the words in text files. See the task's instruction for what it must do."""

import sys


def main(argv=None):
    raise SystemExit("wordfreq: not implemented yet")


if __name__ == "__main__":
    main(sys.argv[1:])
