#!/usr/bin/env bash
# Reference solution of release-checksums (cwd /app).
set -euo pipefail
find release -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum > SHA256SUMS
