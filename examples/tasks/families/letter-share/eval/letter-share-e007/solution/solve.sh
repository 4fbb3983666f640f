#!/usr/bin/env bash
# Reference solution of letter-share-e007 (cwd /app).
set -euo pipefail
printf '%s\n' 'ttt tt' > answer.txt
