#!/usr/bin/env bash
# Verifier of the refactor-pricing task: the pytest tests next to this script, run against the agent's /app.
# Reward in /logs/verifier/reward.txt: 1.0 when every test passes (behaviour kept and structure changed), else 0.0.
# The untouched start state scores 0.0 and solution/solve.sh 1.0.
# Paths are /app, /tests and /logs/verifier; POLAR_APP, POLAR_TESTS and POLAR_LOGS override them, so the script also
# runs outside a sandbox (examples/tasks/README.md).
set -uo pipefail
SCORING=all
APP=${POLAR_APP:-/app}
TESTS=${POLAR_TESTS:-/tests}
LOGS=${POLAR_LOGS:-/logs/verifier}
# Absolute paths, since the script changes directory (the overrides may be relative).
mkdir -p "$LOGS" && LOGS=$(cd "$LOGS" && pwd) && TESTS=$(cd "$TESTS" && pwd) && cd "$APP" && APP=$PWD || exit 1
rm -f "$LOGS/junit.xml" "$LOGS/reward.txt"

# The agent's files come after the standard library and pytest on sys.path (-P; conftest.py appends APP), no bytecode
# is written into the tests, and no pytest plugin but ours is loaded (no config file either: -c /dev/null).
export POLAR_APP="$APP" PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
python3 -P -m pytest -q --tb=short -c /dev/null --rootdir="$TESTS" -p no:cacheprovider \
    --junitxml="$LOGS/junit.xml" "$TESTS"

# No junit.xml (pytest missing or crashed) leaves no reward: the runner reports verifier_error, never a wrong answer.
python3 -P - "$LOGS/junit.xml" "$SCORING" >"$LOGS/reward.txt.tmp" <<'EOF' || exit 1
import sys
import xml.etree.ElementTree as ET

cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
passed = sum(all(case.find(tag) is None for tag in ("failure", "error", "skipped")) for case in cases)
if sys.argv[2] == "all":
    print(1.0 if cases and passed == len(cases) else 0.0)
else:
    print(passed / len(cases) if cases else 0.0)
EOF
mv "$LOGS/reward.txt.tmp" "$LOGS/reward.txt"
