#!/usr/bin/env bash
# Reference solution of vowel-share-016 (cwd /app).
set -euo pipefail
printf '%s\n' 'aeiou oui eau' > answer.txt
