"""Many short mitmdump runs without paying mitmdump's ~2 s of imports each time: a zygote process imports mitmproxy
and the gateway once, then forks a child per run that calls mitmproxy's own `mitmdump` entry point (what the console
script calls) with the given argv — a fresh process, a fresh master and event loop, the script loaded from disk.

Protocol (one JSON line each way): {"start": argv, "log": path} → {"pid"}; {"poll": pid} → {"rc": int|null};
{"stop": pid} → {"rc"} (SIGTERM, then SIGKILL after 10 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


class Zygote:
    """The test side: start one zygote, run mitmdump children through it."""

    def __init__(self, python: str = sys.executable, env: dict | None = None):
        self.proc = subprocess.Popen([python, "-m", "tests.support.mitmdump_zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        assert self._ask({"hello": True}) == {"ready": True}

    def _ask(self, message: dict) -> dict:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the mitmdump zygote died")
        return json.loads(line)

    def start(self, argv: list[str], log: str) -> int:
        return self._ask({"start": argv, "log": log})["pid"]

    def poll(self, pid: int) -> int | None:
        return self._ask({"poll": pid})["rc"]

    def stop(self, pid: int) -> int:
        return self._ask({"stop": pid})["rc"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def _status(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def _serve() -> None:
    import mitmproxy.tools.main  # noqa: F401 — imported once, inherited by every child
    import polar.addon.gateway  # noqa: F401

    done: dict[int, int] = {}
    for line in sys.stdin:
        msg = json.loads(line)
        if "hello" in msg:
            reply: dict = {"ready": True}
        elif "start" in msg:
            pid = os.fork()
            if pid == 0:
                fd = os.open(msg["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.setsid()
                code = 0
                try:
                    from mitmproxy.tools.main import mitmdump

                    mitmdump(msg["start"])
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
                except BaseException:  # noqa: BLE001
                    import traceback

                    traceback.print_exc()
                    code = 1
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            reply = {"pid": pid}
        elif "poll" in msg:
            pid = msg["poll"]
            if pid not in done:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got:
                    done[pid] = _status(status)
            reply = {"rc": done.get(pid)}
        else:
            pid = msg["stop"]
            if pid not in done:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                deadline = time.time() + 10
                while pid not in done:
                    got, status = os.waitpid(pid, os.WNOHANG)
                    if got:
                        done[pid] = _status(status)
                    elif time.time() > deadline:
                        os.kill(pid, signal.SIGKILL)
                    else:
                        time.sleep(0.02)
            reply = {"rc": done[pid]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
