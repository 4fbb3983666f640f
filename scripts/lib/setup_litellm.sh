#!/usr/bin/env bash
# LiteLLM's proxy in its own Python 3.12 venv (.cache/venvs/litellm): the peer baseline of scripts/bench_gateway.
#
# Not part of CI and not a dependency of the gateway: only the benchmark uses it (docs/field-notes.md: LiteLLM).
# Idempotent: a stamp holds the pinned requirement; when it matches and the `litellm` binary exists, this is a no-op.
#
# Env (all optional):
#   POLAR_ROOT          repository root (default: two levels above this file)
#   POLAR_LITELLM_VENV  venv path (default: $POLAR_ROOT/.cache/venvs/litellm)
#   POLAR_LITELLM_SPEC  pip requirement (default below; the version measured in BENCHMARKS.md)
#   POLAR_LITELLM_FORCE=1  reinstall even when the stamp matches
# Prints the venv's bin directory on success.
set -euo pipefail

ROOT="${POLAR_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
VENV="${POLAR_LITELLM_VENV:-$ROOT/.cache/venvs/litellm}"
SPEC="${POLAR_LITELLM_SPEC:-litellm[proxy]==1.108.7}"  # newer releases need litellm-proxy, not on this index
STAMP="$VENV/.polar-setup.stamp"

say() { printf 'setup_litellm: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

if [ "${POLAR_LITELLM_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC" ] \
    && [ -x "$VENV/bin/litellm" ]; then
  echo "$VENV/bin"
  exit 0
fi

# mitmproxy's venv is 3.12 too, but LiteLLM's dependency tree must not touch it: a separate interpreter env.
PY=""
for cand in "${POLAR_LITELLM_PYTHON:-}" python3.12 "$HOME/.pyenv/versions/3.12.1/bin/python3.12"; do
  [ -n "$cand" ] || continue
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null
  then PY="$cand"; break; fi
done
[ -n "$PY" ] || die "Python 3.12 not found (set POLAR_LITELLM_PYTHON)"

say "creating $VENV with $($PY --version) and installing $SPEC (a few minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "$SPEC" >&2 || die "pip install $SPEC failed"
[ -x "$VENV/bin/litellm" ] || die "no litellm binary after install"
printf '%s' "$SPEC" > "$STAMP"
echo "$VENV/bin"
