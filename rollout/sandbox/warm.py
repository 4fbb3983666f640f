"""Warm slots (`--warm-agents`): python: agents in bwrap without paying the interpreter's imports per sample.

A cold python-agent sample starts a sandbox, an interpreter, and imports its SDK (anthropic ≈ 2 s of CPU, openai
≈ 1 s): most of a one-call sample's cost. A warm slot is one bwrap sandbox that lives across samples (and, under
`polar-rollout serve`, across steps). Its zygote (`python -m polar.rollout.agents.pyagent --warm`) has imported the agent and
the modules its `POLAR_PRELOAD` names; each sample is a fork of it. Per sample, in order:

1. the sample's fresh copy of the start state and its HOME are moved into the slot's /app and HOME;
2. a new host relay socket is made for the sample's session (`proxy-N.sock`): only the processes of this sample are
   alive in the sandbox, so only they can reach it;
3. the zygote forks a leader that listens on the relay port and forks the agent; the answer comes when the agent has
   ended, every other process of the sandbox has been killed and /tmp and /dev/shm are empty;
4. the relay socket is closed and removed; /app, HOME and the agent's output move back to the sample's directories,
   where final.diff and the verifier see them as they would after a cold sample.

What it costs in isolation, against a fresh sandbox per sample: the samples of one slot share a kernel pid, IPC and
network namespace one after another (never at once), and the zygote's memory image. Between samples nothing of the
last one runs (a sweep that does not finish discards the slot), its files are gone, and its relay socket with its
session is closed before the next one is made, so it cannot make a call under the next sample's session. The zygote
and its wrapper are non-dumpable (the agent, the same uid, cannot ptrace them or open their pipes), and each
answer repeats the request's nonce. What it does not reset: System V IPC objects the agent left (no tool of ours
reads them). A timeout, a cancel, or a slot that ends mid-sample kills the whole slot; the next sample starts a new
one. bwrap only; the canary (preflight) stays cold.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from polar.records.files import write_json_atomic
from polar.rollout.sandbox import base as sb
from polar.rollout.sandbox import control, registry
from polar.rollout.sandbox.bwrap import BACKEND as BWRAP, bwrap_command
from polar.rollout.sandbox.cgroup import limit_memory
from polar.rollout.sandbox.relay import HostRelay, proxy_user
from polar.rollout.sandbox.run import _killpg, _tail
from polar.rollout.sandbox.view import Control, check, hand_over

START_TIMEOUT_S = 120.0  # bwrap, an interpreter and three SDK imports on a loaded 2-core machine take ~10 s
IO = "/opt/polar/warm-io"  # the slot's writable output directory inside the sandbox (the agent's stdout, stderr)


class WarmError(sb.SandboxError):
    """The slot could not be started, or ended without answering (infrastructure, never the agent's score)."""


@dataclass(frozen=True)
class SlotKey:
    """What a slot's sandbox is made of: samples with the same key can share one."""

    zygote: tuple[str, ...]
    mounts: tuple[sb.Mount, ...]
    memory_mb: int | None
    cpus: float | None


# bwrap --die-with-parent ends a sandbox when the *thread* that started it ends: slots outlive the sample threads
# (a serve's steps each have their own), so one thread that lives with the process starts them all.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polar-warm-spawn")


class Slot:
    def __init__(self, key: SlotKey, env: dict[str, str]):
        self.key = key
        # named and owned like a control directory, so a dead runner's slot is swept like its sandboxes' are
        self.root = Path(tempfile.mkdtemp(prefix=f"{control.CONTROL_PREFIX}warm-", dir=control._control_base()))
        write_json_atomic(self.root / control.OWNER_FILE, {"pid": os.getpid(), "start": control._start_ticks(
            os.getpid()), "kind": "warm", "created": time.time()}, indent=None)
        self.app, self.home, self.io = self.root / "app", self.root / "home", self.root / "io"
        for d in (self.app, self.home, self.io):
            d.mkdir()
        self.proc: subprocess.Popen | None = None
        self.samples = 0
        self._buf = b""
        spec = sb.SandboxSpec(kind="bwrap", app=self.app, home=self.home,
                              mounts=(*key.mounts, sb.Mount(self.io, IO, True)), env=env, memory_mb=key.memory_mb,
                              cpus=key.cpus, label="polar-warm")
        self.owner = hand_over(spec, BWRAP)
        self.ctl = Control(spec, BWRAP, self.owner)
        self.cgroup = None
        try:
            prefix, self.cgroup, self.memory_limit = limit_memory(key.memory_mb, key.cpus)
            cmd = prefix + bwrap_command(spec, self.ctl, [*key.zygote, "--relay", f"{control.CONTROL}/relay.py"])
            self.stderr = open(self.root / "zygote.stderr", "wb")
            self.proc = _SPAWNER.submit(subprocess.Popen, cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, env={"PATH": sb.DEFAULT_PATH}, cwd="/",
                                        start_new_session=True).result()
            line = self._read_line(START_TIMEOUT_S)
            if line is None or "ready" not in line:
                raise WarmError(f"the warm slot did not start: {self._why()}")
        except BaseException:
            self.close()
            raise

    def _why(self) -> str:
        code = self.proc.poll() if self.proc is not None else None
        tail = _tail(self.root / "zygote.stderr") if (self.root / "zygote.stderr").exists() else ""
        return f"exit {code}: {tail}" if code is not None else (tail or "no answer")

    def _read_line(self, timeout: float) -> dict | None:
        """The zygote's next answer line, or None at its end or the timeout."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run(self, spec: sb.SandboxSpec, argv: list[str], *, stdout: Path, stderr: Path,
            timeout: float) -> tuple[sb.SandboxResult, bool]:
        """One sample (spec: its app, home, env and session) in this slot: (its result, whether the slot can take
        another). Raises WarmError when the slot ended without answering."""
        assert self.proc is not None and self.proc.stdin is not None
        n = self.samples = self.samples + 1
        hand_over(spec, BWRAP)  # the sample's fresh app and HOME belong to the sandbox's uid, as in a cold sandbox
        _move_entries(spec.app, self.app)
        _move_entries(spec.home, self.home)
        relay = HostRelay(str(self.ctl.dir / f"proxy-{n}.sock"), spec.proxy_port, spec.session or "",
                          owner=self.owner) if spec.proxy_port is not None else None
        env = dict(spec.env)
        env["HOME"] = sb.HOME
        env.setdefault("PATH", sb.DEFAULT_PATH)
        nonce = secrets.token_hex(16)
        req = {"nonce": nonce, "env": env, "cwd": sb.APP, "instruction_file": _instruction_file(argv),
               "stdout": f"{IO}/{n}.stdout", "stderr": f"{IO}/{n}.stderr", "port": sb.RELAY_PORT,
               "proxy_user": proxy_user(spec.session or "sandbox"),
               "socket": f"{control.CONTROL}/proxy-{n}.sock" if relay is not None else f"{control.CONTROL}/none"}
        t0 = time.monotonic()
        answer: dict | None = None
        reusable = False
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            answer = self._read_line(timeout)
        except (OSError, ValueError):
            answer = None
        except BaseException:
            self.kill()
            raise
        finally:
            wall = time.monotonic() - t0
            timed_out = answer is None and self.alive()
            if answer is None:
                self.kill()
            connections = relay.connections if relay is not None else 0
            if relay is not None:
                relay.close()
                with contextlib.suppress(OSError):
                    os.unlink(relay.path)
            for name, dst in ((f"{n}.stdout", stdout), (f"{n}.stderr", stderr)):
                src = self.io / name
                if src.exists():
                    shutil.move(src, dst)
                else:
                    Path(dst).touch()
            _empty(self.io)
            _move_entries(self.app, spec.app)
            _move_entries(self.home, spec.home)
        if answer is None and not timed_out:
            raise WarmError(f"the warm slot ended during the sample ({self._why()})")
        if answer is not None:
            if answer.get("nonce") != nonce or not isinstance(answer.get("exit"), int):
                self.kill()
                raise WarmError(f"the warm slot answered out of turn: {answer!r}")
            reusable = bool(answer.get("clean")) and self.alive()
            if not reusable:
                self.kill()
        result = sb.SandboxResult(exit_code=None if answer is None else answer["exit"], timed_out=timed_out,
                                  wall_s=wall, memory_limit=self.memory_limit, proxy_connections=connections)
        return result, reusable

    def kill(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill_all()
        if self.proc is not None and self.proc.poll() is None:
            _killpg(self.proc.pid)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        self.kill()
        if self.proc is not None:
            for f in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError):
                    f.close()
        if getattr(self, "stderr", None) is not None:
            self.stderr.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        self.ctl.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _instruction_file(argv: list[str]) -> str:
    if "--instruction-file" not in argv:
        raise sb.SandboxError("a warm slot needs the agent's --instruction-file")
    return argv[argv.index("--instruction-file") + 1]


def _move_entries(src: Path, dst: Path) -> None:
    """Move every entry of directory `src` into directory `dst` (emptied first): renames on one filesystem."""
    _empty(dst)
    for name in os.listdir(src):
        shutil.move(os.path.join(src, name), os.path.join(dst, name))


def _empty(directory: Path) -> None:
    for name in os.listdir(directory):
        p = Path(directory) / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()


# ---------------------------------------------------------------------------------------------- the pool

_lock = threading.Lock()
_idle: dict[SlotKey, list[Slot]] = {}
_busy: set[Slot] = set()


def key_of(spec: sb.SandboxSpec, argv: list[str]) -> SlotKey:
    """The slot key of a python: agent's cold argv (`python -m polar.rollout.agents.pyagent MODULE:FUNC
    --instruction-file F`)."""
    if argv[1:3] != ["-m", "polar.rollout.agents.pyagent"] or len(argv) < 4:
        raise sb.SandboxError(f"a warm slot runs python: agents only, not {argv[:3]}")
    return SlotKey(zygote=(argv[0], "-m", "polar.rollout.agents.pyagent", "--warm", argv[3]), mounts=tuple(spec.mounts),
                   memory_mb=spec.memory_mb, cpus=spec.cpus)


def run_warm(spec: sb.SandboxSpec, argv: list[str], *, stdout: Path, stderr: Path,
             timeout: float) -> sb.SandboxResult:
    """One python: agent sample in a warm slot of the pool (a new slot when none of its key is idle)."""
    if not registry.get(spec.kind).warm_slots:
        raise sb.SandboxError(f"--warm-agents runs in bwrap only, not --sandbox {spec.kind}")
    check(spec, BWRAP)
    key = key_of(spec, argv)
    slot = None
    with _lock:
        idle = _idle.get(key, [])
        while idle and slot is None:
            cand = idle.pop()
            if cand.alive():
                slot = cand
            else:
                cand.close()
        if slot is not None:
            _busy.add(slot)
    if slot is None:
        slot = Slot(key, {k: v for k, v in spec.env.items() if k in _ZYGOTE_ENV})
        with _lock:
            _busy.add(slot)
    reusable = False
    try:
        result, reusable = slot.run(spec, argv, stdout=stdout, stderr=stderr, timeout=timeout)
        return result
    finally:
        with _lock:
            _busy.discard(slot)
            if reusable:
                _idle.setdefault(key, []).append(slot)
        if not reusable:
            slot.close()


# The zygote's own environment: what the interpreter and the imports need; every sample brings its whole own.
_ZYGOTE_ENV = ("PATH", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONNOUSERSITE", "LANG",
               "LC_ALL", "POLAR_AGENT_DIR")


def close_all() -> int:
    """End every idle slot (a busy one ends with its sample's thread's cancel): how many were ended."""
    with _lock:
        slots = [s for group in _idle.values() for s in group]
        _idle.clear()
    for s in slots:
        s.close()
    return len(slots)
