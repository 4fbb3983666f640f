#!/usr/bin/env bash
# Reference solution of digit-steps-014 (cwd /app).
set -euo pipefail
for n in $(seq 1 3); do printf '%s\n' '20260412 31415926 27182818' > "note$n.txt"; done
