#!/usr/bin/env bash
# Reference solution of letter-share-012 (cwd /app).
set -euo pipefail
printf '%s\n' 'eee ee' > answer.txt
