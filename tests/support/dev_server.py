"""One float32 dev-mode tiny vLLM for the whole .venv-train session: tests/trainer and tests/integrations each
have a `dev_server` fixture, and both return this one server (a session fixture defined in two conftests would start
two). Started on first use, stopped when the session's process exits. A test that publishes other weights restores
the original ones before it ends (`restore`)."""

from __future__ import annotations

import atexit
import subprocess
import sys
from pathlib import Path

from tests.support.vllm_server import VllmServer, start_vllm, stop_vllm

ROOT = Path(__file__).resolve().parents[2]
TINY = f"{ROOT}/.cache/models/tiny"
_SERVER: VllmServer | None = None


def shared() -> VllmServer:
    global _SERVER
    if _SERVER is None:
        _SERVER = start_vllm("tiny", dtype="float32", dev=True)
        atexit.register(stop_vllm, _SERVER)
    return _SERVER


def restore(server: VllmServer) -> None:
    """The shared server goes back to the original weights (other tests run against them)."""
    proc = subprocess.run([sys.executable, f"{ROOT}/scripts/vllm", "reload", "--weights", TINY, "--version", "base",
                           "--run-file", server.run_file], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
