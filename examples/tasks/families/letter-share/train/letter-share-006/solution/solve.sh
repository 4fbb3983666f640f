#!/usr/bin/env bash
# Reference solution of letter-share-006 (cwd /app).
set -euo pipefail
printf '%s\n' 'eee ee' > answer.txt
