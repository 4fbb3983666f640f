#!/usr/bin/env bash
# Reference solution of letter-share-001 (cwd /app).
set -euo pipefail
printf '%s\n' 'ttt tt' > answer.txt
