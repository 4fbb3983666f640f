#!/usr/bin/env bash
# Reference solution of letter-share-003 (cwd /app).
set -euo pipefail
printf '%s\n' 'ooo oo' > answer.txt
