#!/usr/bin/env bash
# Verifier of digit-steps-030 (family digit-steps, examples/tasks/families/generate.py).
# The score: the share of digits among the letters and digits of each of note1.txt … note3.txt in /app,
# averaged over the 3 notes (a missing note scores 0.0), in /logs/verifier/reward.txt.
# The solution scores 1.0.
# Paths are /app, /tests and /logs/verifier; POLAR_APP, POLAR_TESTS and POLAR_LOGS override them.
set -uo pipefail
APP=${POLAR_APP:-/app}
TESTS=${POLAR_TESTS:-/tests}
LOGS=${POLAR_LOGS:-/logs/verifier}
mkdir -p "$LOGS" && LOGS=$(cd "$LOGS" && pwd) && cd "$APP" || exit 1
rm -f "$LOGS/reward.txt"
python3 -P - "$APP" >"$LOGS/reward.txt.tmp" <<'PY' || exit 1
import os
import sys

total = 0.0
for n in range(1, 3 + 1):
    path = os.path.join(sys.argv[1], f"note{n}.txt")
    if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("ascii", errors="ignore")
        among = [c for c in text if c.isascii() and c.isalnum()]
        total += sum(1 for c in among if c.isdigit()) / len(among) if among else 0.0
print(round(total / 3, 6))
PY
mv "$LOGS/reward.txt.tmp" "$LOGS/reward.txt"
