#!/usr/bin/env bash
# Reference solution of letter-share-030 (cwd /app).
set -euo pipefail
printf '%s\n' 'eee ee' > answer.txt
