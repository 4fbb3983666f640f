#!/usr/bin/env bash
# Reference solution of upper-share-e002 (cwd /app).
set -euo pipefail
printf '%s\n' 'SHOUTING IN CAPITALS' > answer.txt
