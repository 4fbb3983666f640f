#!/usr/bin/env bash
# Reference solution of digit-share-026 (cwd /app).
set -euo pipefail
printf '%s\n' '20260412 31415926 27182818' > answer.txt
