#!/usr/bin/env bash
# Reference solution of vowel-share (cwd /app).
set -euo pipefail
printf 'aeiou eia ou\n' > answer.txt
