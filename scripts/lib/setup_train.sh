#!/usr/bin/env bash
# The trainer environment (docs/architecture.md#the-trainer-side): `.venv-train`, Python 3.11 (the interpreter
# .venv-vllm uses), with the project and its [train] and [trl] extras. torch is pinned to 2.13.0: on a CPU machine the local `+cpu`
# wheel pip finds (docs/field-notes.md); PyPI's plain torch would pull the CUDA build, so a machine without that wheel
# fails here in seconds.
#
# Idempotent: a stamp records pyproject.toml's hash; when it matches, this is a no-op in well under a second.
# Env (optional): POLAR_TRAIN_VENV (default $ROOT/.venv-train), POLAR_TRAIN_PYTHON (a Python 3.11).
set -euo pipefail

ROOT="${POLAR_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
VENV="${POLAR_TRAIN_VENV:-$ROOT/.venv-train}"
STAMP="$VENV/.polar-setup.stamp"
LOG_DIR="$ROOT/.cache/setup-logs"
spec="train,trl $(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"

say() { printf 'setup --train: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$spec" && -x "$VENV/bin/python" ]]; then
    exit 0
fi

# shellcheck source=py311.sh
source "$(dirname "${BASH_SOURCE[0]}")/py311.sh"

mkdir -p "$LOG_DIR"
log="$LOG_DIR/train.log"
: >"$log"

t0=$SECONDS
if [[ ! -x "$VENV/bin/python" ]]; then
    py="$(find_python311 "${POLAR_TRAIN_PYTHON:-}")" || die "Python 3.11 not found (the torch CPU wheel is cp311); set POLAR_TRAIN_PYTHON"
    say "creating $VENV with $py"
    run env PYENV_VERSION=3.11.7 "$py" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
say "installing the project with [train,trl] (torch 2.13.0 CPU, transformers 5.19.0, trl 1.16; log: $log)"
run "${pip[@]}" install -e "$ROOT[train,trl]"
run "$VENV/bin/python" -c 'import torch, transformers, safetensors, trl, polar.processor, polar.trainer, polar.integrations.trl'
printf '%s' "$spec" >"$STAMP"
say "done in $((SECONDS - t0)) s: $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
