"""The options of `polar-vllm start`: `StartSpec` (what a start serves and how; `to_args`/`from_args`, the arguments
that bring a restarted server back), the command line's parser, their defaults and environment variables, and the
two errors every vLLM command reports (`Fail`, exit 1; `BadInput`, exit 2). The floor of polar.launch's vllm
modules: vllm_server and vllm_pool import it, it imports neither. Standard library only, as polar.launch.vllm."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from polar.launch import paths
from polar.records.cliargs import OneLineParser, positive_int

VENV_ENV, MODELS_ENV, TIMEOUT_ENV = "POLAR_VLLM_VENV", "POLAR_MODELS_DIR", "POLAR_VLLM_START_TIMEOUT"


class Fail(Exception):
    """A user-facing error: printed without a traceback, exit code 1."""


class BadInput(Fail):
    """A command line or run file that cannot work: one line, exit code 2."""


def default_run_file() -> Path:
    return paths.vllm_run_file()


def _default_timeout() -> float:
    return float(os.environ.get(TIMEOUT_ENV, 600))


@dataclass
class StartSpec:
    """What `start` serves and how; `to_args` gives the command-line arguments that bring the same server back."""

    model: str = "tiny"
    port: int | None = None
    max_model_len: int | None = None
    logprobs_mode: str = "raw_logprobs"
    dtype: str = "bfloat16"
    dev: bool = False
    name: str | None = None
    timeout: float = field(default_factory=_default_timeout)
    run_file: Path = field(default_factory=default_run_file)
    extra: list[str] = field(default_factory=list)
    vllm_venv: str | None = None
    models_dir: str | None = None
    replicas: int = 1  # > 1: a pool (start_pool); 0: one replica per visible CUDA device
    device: str | None = None  # the CUDA device of this one server (CUDA_VISIBLE_DEVICES), as a pool gives it
    tensor_parallel_size: int = 1  # > 1: vLLM's --tensor-parallel-size, a GPU build only

    def to_args(self, port: int | None = None) -> list[str]:
        port = self.port if port is None else port
        out = ["--model", self.model, *(["--port", str(port)] if port is not None else []),
               "--logprobs-mode", self.logprobs_mode, "--dtype", self.dtype, "--timeout", f"{self.timeout:g}",
               *(["--dev"] if self.dev else []),
               *(["--max-model-len", str(self.max_model_len)] if self.max_model_len else []),
               *(["--name", self.name] if self.name else []),
               *(["--vllm-venv", self.vllm_venv] if self.vllm_venv else []),
               *(["--models-dir", self.models_dir] if self.models_dir else []),
               *(["--device", self.device] if self.device is not None else []),
               *(["--tensor-parallel-size", str(self.tensor_parallel_size)] if self.tensor_parallel_size != 1
                 else []),
               *(["--replicas", str(self.replicas or "auto")] if self.replicas != 1 else [])]
        return out + (["--", *self.extra] if self.extra else [])

    @classmethod
    def from_args(cls, argv: list[str], run_file: Path | str | None = None) -> "StartSpec":
        """The spec of `start` arguments (as `to_args` writes them; BadInput for what the parser refuses)."""
        argv = list(argv)
        extra: list[str] = []
        if "--" in argv:
            i = argv.index("--")
            argv, extra = argv[:i], argv[i + 1:]
        parser = OneLineParser(prog="start", add_help=False, raises=BadInput)
        add_start_arguments(parser)
        args = parser.parse_args(argv)
        if run_file is not None:
            args.run_file = str(run_file)
        return cls.from_namespace(args, extra)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, extra: list[str]) -> "StartSpec":
        return cls(model=args.model, port=args.port, max_model_len=args.max_model_len,
                   logprobs_mode=args.logprobs_mode, dtype=args.dtype, dev=args.dev, name=args.name,
                   timeout=args.timeout, run_file=Path(args.run_file), extra=list(extra),
                   vllm_venv=args.vllm_venv, models_dir=args.models_dir, replicas=args.replicas,
                   device=args.device, tensor_parallel_size=args.tensor_parallel_size)





def add_start_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `start` (the command line's and `StartSpec.from_args`')."""
    p.add_argument("--model", default="tiny", help="tiny | smollm2 | a model directory (default: tiny)")
    p.add_argument("--port", type=int, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--max-model-len", type=int, help="context length (default: per model; tiny 65536, smollm2 8192)")
    p.add_argument("--logprobs-mode", default="raw_logprobs", choices=["raw_logprobs", "processed_logprobs"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="weights and activations (default bfloat16; float32 for logprob verification)")
    p.add_argument("--dev", action="store_true",
                   help="VLLM_SERVER_DEV_MODE=1: the weight-reload endpoints `reload` uses")
    p.add_argument("--name", help="served model name (default: the preset name or the directory name)")
    p.add_argument("--timeout", type=float, default=_default_timeout(),
                   help=f"seconds to wait for /health (default 600, or {TIMEOUT_ENV})")
    p.add_argument("--run-file", default=str(default_run_file()))
    p.add_argument("--replicas", type=_replicas, default=1, metavar="N|auto",
                   help="a pool of N servers of this spec, each on its own port; on a GPU build one per CUDA device "
                        "(auto: one per visible device) (default 1)")
    p.add_argument("--device", metavar="D", help="the CUDA device this server runs on (CUDA_VISIBLE_DEVICES=D); a "
                                                  "pool gives each replica its own")
    p.add_argument("--tensor-parallel-size", type=positive_int, default=1, metavar="N",
                   help="shard the model over N GPUs (vLLM's --tensor-parallel-size; a GPU build of vLLM only, one "
                        "server: not with --replicas) (default 1)")
    add_venv_argument(p)
    p.add_argument("--models-dir", metavar="DIR",
                   help=f"where the preset models are (default: {MODELS_ENV}, else the checkout's .cache/models)")


def _replicas(text: str) -> int:
    if text == "auto":
        return 0
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--replicas must be a positive number or auto (got {text!r})")
    return n


def add_venv_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vllm-venv", metavar="DIR",
                   help=f"the vLLM environment (default: {VENV_ENV}, else the checkout's .venv-vllm)")
