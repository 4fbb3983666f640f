#!/usr/bin/env bash
# Reference solution of letter-share-028 (cwd /app).
set -euo pipefail
printf '%s\n' 'nnn nn' > answer.txt
