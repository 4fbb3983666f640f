#!/usr/bin/env bash
# Reference solution of hello-file (cwd /app).
set -euo pipefail
printf 'Hello, Polar!\n' > hello.txt
