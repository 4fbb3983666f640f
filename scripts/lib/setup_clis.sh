#!/usr/bin/env bash
# The five agent CLIs, pinned, installed from npm into .cache/npm (called by `scripts/setup --clis`).
#
# Binaries land in .cache/npm/node_modules/.bin (claude, codex, gemini, qwen, pi); scripts/run-agent looks there
# first, then on PATH. The versions are the ones docs/field-notes.md (the agent CLIs) measured; bump them here and in
# the README table. Idempotent: a stamp holds the hash of the pinned list; when it matches and every binary exists, this
# is a no-op in well under a second.
#
# Env (all optional):
#   POLAR_ROOT       repository root (default: two levels above this file)
#   POLAR_NPM_DIR    install prefix (default: $POLAR_ROOT/.cache/npm)
#   POLAR_CLIS_FORCE=1  reinstall even when the stamp matches
set -euo pipefail

ROOT="${POLAR_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
PREFIX="${POLAR_NPM_DIR:-$ROOT/.cache/npm}"
PACKAGES=(
  "@anthropic-ai/claude-code@2.1.197"
  "@openai/codex@0.171.0"
  "@google/gemini-cli@0.61.0"
  "@qwen-code/qwen-code@0.15.10"
  "@mariozechner/pi-coding-agent@0.73.1"
)
BINARIES=(claude codex gemini qwen pi)
LOG_DIR="$ROOT/.cache/setup-logs"
STAMP="$PREFIX/.polar-setup.stamp"

say() { printf 'setup --clis: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

want="$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-16)"
all_present() {
  local b
  for b in "${BINARIES[@]}"; do [ -x "$PREFIX/node_modules/.bin/$b" ] || return 1; done
}
if [ "${POLAR_CLIS_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && all_present; then
  exit 0
fi

command -v npm >/dev/null 2>&1 || die "npm not found (Node.js >= 20 is needed for the CLIs)"
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 20 ] || die "Node.js >= 20 is needed, found $(node --version)"

mkdir -p "$PREFIX" "$LOG_DIR"
# A private package.json keeps the install out of the repository's (absent) node project and makes it reproducible.
if [ ! -f "$PREFIX/package.json" ]; then
  printf '{"name": "polar-agent-clis", "private": true}\n' > "$PREFIX/package.json"
fi
log="$LOG_DIR/npm-clis.log"
say "installing ${PACKAGES[*]} into $PREFIX (log: $log)"
# --save-exact pins in the private package.json; optional deps are needed (Claude Code and Codex ship the native
# binary as per-platform optional packages); no audit/fund chatter.
if ! npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund --loglevel=error "${PACKAGES[@]}" >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  die "npm install failed"
fi
all_present || die "npm finished but a binary is missing under $PREFIX/node_modules/.bin ($(ls "$PREFIX/node_modules/.bin" | tr '\n' ' '))"
printf '%s' "$want" > "$STAMP"
say "done: $(for b in "${BINARIES[@]}"; do printf '%s ' "$b"; done)in $PREFIX/node_modules/.bin"
