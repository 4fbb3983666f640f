#!/usr/bin/env bash
# Reference solution of upper-share-031 (cwd /app).
set -euo pipefail
printf '%s\n' 'SHOUTING IN CAPITALS' > answer.txt
