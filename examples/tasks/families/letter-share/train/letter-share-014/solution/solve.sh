#!/usr/bin/env bash
# Reference solution of letter-share-014 (cwd /app).
set -euo pipefail
printf '%s\n' 'aaa aa' > answer.txt
