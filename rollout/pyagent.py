"""`python -m polar.rollout.pyagent MODULE:FUNC [--instruction-file FILE]` — a Python agent, run like a CLI.

polar-rollout runs this inside the sample's sandbox with `.venv`'s interpreter (`--agent python:MODULE:FUNC`).
MODULE is imported from the task's `agent/` folder (`$POLAR_AGENT_DIR`), else from `sys.path`; then
`FUNC(instruction: str, workdir: str, env: dict[str, str]) -> int | None` is called with the instruction (the file
named by `--instruction-file`, else `$POLAR_INSTRUCTION_FILE`, else stdin), the working directory (the agent's cwd,
`/app` in a sandbox) and a copy of the environment (HTTPS_PROXY and the CA variables are already set, so the official
SDKs reach the model through the proxy unchanged). Its return value is the exit code (None = 0); an exception is
exit 1 with the traceback on stderr. Standard library only: this file is bound into sandboxes on its own.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback


def load(spec: str, agent_dir: str | None):
    """The callable named by MODULE:FUNC (FUNC may be dotted: `mod:Class.method`)."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"expected MODULE:FUNC, got {spec!r}")
    if agent_dir and os.path.isdir(agent_dir):
        sys.path.insert(0, agent_dir)
    obj = importlib.import_module(module_name)
    for part in func_name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is not callable")
    return obj


def read_instruction(path: str | None) -> str:
    path = path or os.environ.get("POLAR_INSTRUCTION_FILE")
    if path:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    return sys.stdin.read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polar.rollout.pyagent", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", metavar="MODULE:FUNC")
    parser.add_argument("--instruction-file", metavar="FILE",
                        help="the instruction (default: $POLAR_INSTRUCTION_FILE, else stdin)")
    args = parser.parse_args(argv)
    try:
        func = load(args.spec, os.environ.get("POLAR_AGENT_DIR"))
        instruction = read_instruction(args.instruction_file)
        code = func(instruction, os.getcwd(), dict(os.environ))
    except SystemExit as exc:  # the agent chose its exit code
        code = exc.code
    except BaseException:  # noqa: BLE001 — every failure of the agent is its exit 1, with the traceback
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    finally:
        sys.stdout.flush()
    if code is None:
        return 0
    if isinstance(code, bool) or not isinstance(code, int):
        print(f"polar.rollout.pyagent: {args.spec} returned {code!r}, not an int or None; exit 1", file=sys.stderr)
        return 1
    return code & 0xFF if code >= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
