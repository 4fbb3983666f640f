"""A local vLLM, one server or a pool of replicas: what the trainer, the integrations and the scripts call.

Three siblings do the work, and this module stands above them (none imports it):
- `vllm_args`: `StartSpec` (what a start serves and how), the start options, `Fail` (exit 1) and `BadInput` (exit 2);
- `vllm_server`: one server — start, stop, health, presets, the vLLM environment, restored weights;
- `vllm_pool`: a pool (`StartSpec.replicas` N > 1) — side by side, one CUDA device each on GPU, stopped together.
`stop` and `status` here take either kind of run file. Standard library only: this runs in the proxy's, the
trainer's and any installed environment.
"""

from __future__ import annotations

from pathlib import Path

from polar.launch.runfiles import VllmPoolRunFile, VllmRunFile
from polar.launch.vllm_args import BadInput, Fail, StartSpec, default_run_file
from polar.launch.vllm_pool import replica_health, start_pool, stop_pool
from polar.launch.vllm_server import (Log, Stopped, command, healthy, http_json, is_server, quiet, read_any, read_pool,
                                      read_run_file, replica_infos, say, served_weights, start)
from polar.launch.vllm_server import stop as stop_server

__all__ = ["BadInput", "Fail", "Log", "StartSpec", "Stopped", "command", "default_run_file", "healthy", "http_json",
           "quiet", "read_any", "read_pool", "read_run_file", "replica_infos", "say", "served_weights", "start",
           "start_pool", "status", "stop"]


def stop(run_file: Path | str | None = None, timeout: float = 30.0, log: Log = say) -> Stopped:
    """Stop the server of the run file (never a pid that is not ours) and remove the file; for a pool, every replica
    (side by side) and every replica's run file."""
    run_file = Path(run_file) if run_file is not None else default_run_file()
    pool = read_pool(run_file)
    if pool is not None:
        return stop_pool(run_file, pool, timeout, log)
    return stop_server(run_file, timeout, log)


def status(run_file: Path | str | None = None) -> VllmRunFile | VllmPoolRunFile | None:
    """The run file when its server is ours and healthy (a pool's when every replica is), else None."""
    current = read_any(Path(run_file) if run_file is not None else default_run_file())
    if isinstance(current, VllmPoolRunFile):
        return current if all(ok for _, _, ok in replica_health(current)) else None
    if current is not None and is_server(current.pid) and healthy(current.port or 0):
        return current
    return None
