#!/bin/bash
# Runs inside python:3.12-slim after the agent, with the task's environment (GREETING).
mkdir -p /logs/verifier
out="$(cd /tmp && python3 /app/greet.py Ada 2>/dev/null)"
if [ "$out" = "$GREETING, Ada!" ] && [ "$(python3 -c 'import sys; print(sys.version_info[:2] >= (3, 12))')" = True ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
