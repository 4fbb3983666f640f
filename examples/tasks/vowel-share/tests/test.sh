#!/usr/bin/env bash
# Verifier of the vowel-share task: a graded reward, the share of answer.txt's letters and digits (ASCII, any case)
# that are vowels (a e i o u), in /logs/verifier/reward.txt. No file or no letter scores 0.0; the solution 1.0.
# Under a random policy the share varies from sample to sample, so a group of K gets a reward spread (non-zero
# advantages) even before any training: the task polar-train's CI loop runs on.
# Paths are /app, /tests and /logs/verifier; POLAR_APP, POLAR_TESTS and POLAR_LOGS override them
# (examples/tasks/README.md).
set -uo pipefail
APP=${POLAR_APP:-/app}
TESTS=${POLAR_TESTS:-/tests}
LOGS=${POLAR_LOGS:-/logs/verifier}
mkdir -p "$LOGS" && LOGS=$(cd "$LOGS" && pwd) && cd "$APP" || exit 1
rm -f "$LOGS/reward.txt"
python3 -P - "$APP/answer.txt" >"$LOGS/reward.txt.tmp" <<'PY' || exit 1
import sys

try:
    with open(sys.argv[1], "rb") as f:
        text = f.read(1 << 20).decode("ascii", errors="ignore").lower()
except (FileNotFoundError, IsADirectoryError):
    text = ""
alnum = [c for c in text if c.isascii() and c.isalnum()]
print(round(sum(c in "aeiou" for c in alnum) / len(alnum), 6) if alnum else 0.0)
PY
mv "$LOGS/reward.txt.tmp" "$LOGS/reward.txt"
