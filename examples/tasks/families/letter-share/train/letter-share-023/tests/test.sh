#!/usr/bin/env bash
# Verifier of letter-share-023 (family letter-share, examples/tasks/families/generate.py): a graded reward, the share of the letter `s` (either case) among the letters and digits, over every
# regular file the agent left in /app, in /logs/verifier/reward.txt. No file or no counted character scores 0.0; the
# solution 1.0. Paths are /app, /tests and /logs/verifier; POLAR_APP, POLAR_TESTS and POLAR_LOGS override them.
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
                text += f.read(1 << 20).decode("ascii", errors="ignore")
among = [c for c in text if c.isascii() and c.isalnum()]
print(round(sum(1 for c in among if c.lower() == 's') / len(among), 6) if among else 0.0)
PY
mv "$LOGS/reward.txt.tmp" "$LOGS/reward.txt"
