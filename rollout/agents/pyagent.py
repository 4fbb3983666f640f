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


def call(spec: str, func, instruction: str) -> int:
    """Run the agent once in this process: its exit code (see the module docstring)."""
    try:
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
        print(f"polar.rollout.pyagent: {spec} returned {code!r}, not an int or None; exit 1", file=sys.stderr)
        return 1
    return code & 0xFF if code >= 0 else 1


# ---------------------------------------------------------------------------------------------- warm mode
#
# `python -m polar.rollout.pyagent --warm MODULE:FUNC --relay /run/polar/relay.py` is the zygote of a warm slot
# (rollout/sandbox/warm.py): one sandbox that runs many samples one after another. It imports the agent and the modules the
# agent names in POLAR_PRELOAD once, says {"ready": pid} on stdout, then takes one JSON request per line on stdin and
# answers each with one line. Per request it forks a leader (its own session) that listens on the sandbox's loopback
# relay port, forks the agent (a copy of the pre-imported interpreter: no import is paid again) and relays the
# agent's connections to that sample's own host socket; when the leader ends, every other process of the sandbox is
# killed and /tmp and /dev/shm are emptied before the answer. Requests carry a nonce the answer repeats.

def _load_relay(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("polar_sandbox_relay", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the relay from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _empty(directory: str) -> None:
    import shutil

    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def _leader(spec: str, func, relay, req: dict, reply_fd: int) -> None:
    """The forked leader of one sample: never returns."""
    code = 125
    try:
        os.close(reply_fd)  # the answer channel is the zygote's alone
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        env = dict(req["env"])
        listener = relay._listen(env, req["proxy_user"], int(req["port"]))  # HTTPS_PROXY points at it
        agent = os.fork()
        if agent == 0:  # the agent: a copy of the pre-imported interpreter, single-threaded
            listener.close()
            relay._prctl(relay.PR_SET_DUMPABLE, 1)  # as a cold agent is: the zygote's protection is the zygote's
            os.environ.clear()
            os.environ.update(env)
            os.chdir(req["cwd"])
            os._exit(call(spec, func, read_instruction(req["instruction_file"])))
        import threading

        threading.Thread(target=relay._sandbox_accept, args=(listener, req["socket"]), daemon=True).start()
        _, status = os.waitpid(agent, 0)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    except BaseException:  # noqa: BLE001 — the sample's own stderr says why
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def serve_warm(spec: str, relay_path: str) -> int:
    """The zygote's loop (see above); ends at the end of stdin."""
    import json

    relay = _load_relay(relay_path)  # the sandbox's wrapper module: the listener, prctl, the sweep
    relay._prctl(relay.PR_SET_DUMPABLE, 0)  # a sample's agent (same uid) cannot ptrace this process or read its pipes
    func = load(spec, os.environ.get("POLAR_AGENT_DIR"))
    for name in getattr(importlib.import_module(spec.partition(":")[0]), "POLAR_PRELOAD", ()):
        importlib.import_module(name)
    reply = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # nothing but answers on the answer channel
    reply.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        leader = os.fork()
        if leader == 0:
            _leader(spec, func, relay, req, reply.fileno())
        _, status = os.waitpid(leader, 0)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        killed, clean = relay.kill_all_but_ancestors()
        for directory in ("/tmp", "/dev/shm"):
            _empty(directory)
        reply.write(json.dumps({"nonce": req["nonce"], "exit": code, "killed": killed, "clean": clean}) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polar.rollout.pyagent", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", metavar="MODULE:FUNC")
    parser.add_argument("--instruction-file", metavar="FILE",
                        help="the instruction (default: $POLAR_INSTRUCTION_FILE, else stdin)")
    parser.add_argument("--warm", action="store_true", help="be a warm slot's zygote (rollout/sandbox/warm.py)")
    parser.add_argument("--relay", metavar="FILE", help="--warm: the sandbox's relay.py")
    args = parser.parse_args(argv)
    if args.warm:
        if not args.relay:
            parser.error("--warm needs --relay FILE")
        return serve_warm(args.spec, args.relay)
    try:
        func = load(args.spec, os.environ.get("POLAR_AGENT_DIR"))
        instruction = read_instruction(args.instruction_file)
    except BaseException:  # noqa: BLE001 — an agent that cannot be loaded is its exit 1, with the traceback
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    return call(args.spec, func, instruction)


if __name__ == "__main__":
    sys.exit(main())
