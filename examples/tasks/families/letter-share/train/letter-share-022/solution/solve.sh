#!/usr/bin/env bash
# Reference solution of letter-share-022 (cwd /app).
set -euo pipefail
printf '%s\n' 'nnn nn' > answer.txt
