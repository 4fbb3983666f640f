#!/usr/bin/env bash
# Reference solution of letter-share-025 (cwd /app).
set -euo pipefail
printf '%s\n' 'ttt tt' > answer.txt
