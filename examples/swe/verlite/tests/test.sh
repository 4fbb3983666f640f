#!/bin/bash
# The verifier of an SWE task (examples/swe/README.md): grade.py, beside this file, grades /testbed as SWE-bench does
# and writes /logs/verifier/reward.txt and reward.json. Every task's tests/test.sh is a copy of this file.
exec python3 "$(dirname "$0")/grade.py" "$@"
