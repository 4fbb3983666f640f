"""The options of `polar-vllm start` (the command line's and `StartSpec.from_args`', which reads a restarted server's
saved arguments back). Standard library only, as polar.launch.vllm."""

from __future__ import annotations

import argparse

from polar.launch.vllm import BadInput, _default_timeout, default_run_file, TIMEOUT_ENV, MODELS_ENV, VENV_ENV


class Strict(argparse.ArgumentParser):
    def error(self, message: str):
        raise BadInput(f"start arguments: {message}")


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
