#!/bin/bash
# Runs inside the task's image (which has tree) after the agent.
mkdir -p /logs/verifier
cd /srv/project || { echo 0 > /logs/verifier/reward.txt; exit 0; }
expected="$(tree -a --noreport --charset ascii src)"
if [ -f TREE.txt ] && [ "$(cat TREE.txt)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
