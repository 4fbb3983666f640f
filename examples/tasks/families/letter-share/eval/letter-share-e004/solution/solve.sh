#!/usr/bin/env bash
# Reference solution of letter-share-e004 (cwd /app).
set -euo pipefail
printf '%s\n' 'nnn nn' > answer.txt
