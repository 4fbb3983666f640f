#!/bin/bash
# Runs inside the task's image after the agent: pytest was installed there by the Dockerfile.
mkdir -p /logs/verifier
cd /tests
if python -m pytest -q -p no:cacheprovider test_report.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
