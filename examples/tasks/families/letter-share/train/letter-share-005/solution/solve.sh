#!/usr/bin/env bash
# Reference solution of letter-share-005 (cwd /app).
set -euo pipefail
printf '%s\n' 'sss ss' > answer.txt
