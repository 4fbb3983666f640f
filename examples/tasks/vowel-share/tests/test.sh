#!/usr/bin/env bash
# Verifier of the vowel-share task: a graded reward, the share of the letters and digits (ASCII, any case) that are
# vowels (a e i o u) over every regular file the agent left in /app (answer.txt is asked for; a file of another name
# counts too, so a random policy that picks a random name still gets a graded score), in /logs/verifier/reward.txt.
# No file or no letter scores 0.0; the solution 1.0.
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
python3 -P - "$APP" >"$LOGS/reward.txt.tmp" <<'PY' || exit 1
import os
import sys

text = ""
for dirpath, dirnames, filenames in os.walk(sys.argv[1]):
    dirnames[:] = [d for d in dirnames if d != ".git"]
    for name in sorted(filenames):
        path = os.path.join(dirpath, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                text += f.read(1 << 20).decode("ascii", errors="ignore").lower()
alnum = [c for c in text if c.isascii() and c.isalnum()]
print(round(sum(c in "aeiou" for c in alnum) / len(alnum), 6) if alnum else 0.0)
PY
mv "$LOGS/reward.txt.tmp" "$LOGS/reward.txt"
