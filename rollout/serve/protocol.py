"""The protocol of `polar-rollout serve DIR` (docs/contracts.md#polar-rollout-serve): a long-lived rollout stage and
its clients meet in one directory, through files written whole (a temporary name starting with ".", then a rename).

    DIR/ready.json              the serve is ready (Ready): its pid, its proxy, the flow directory, the preflight
    DIR/requests/<name>.json    one polar-rollout run asked for (RolloutRequest)
    DIR/responses/<name>.json   its answer once the run has ended (RolloutResponse)
    DIR/logs/<name>.log         the run's lines (polar-rollout's stderr), unless the request names its own `log`
    DIR/stop                    asks the serve to end: running runs are cancelled (exit 130), the proxy stopped
    DIR/ended.json              the serve has ended: {"exit", "reason", "pid", "t"} (ready.json is removed first)

A name is letters, digits, ".", "_" and "-" (not starting with "."). A request without a response is served, also one
left by an earlier serve of DIR; a name already answered is not served again. Several requests run at once.

Standard library only: polar-train (its own Python, without mitmproxy) imports this module and nothing else of the
rollout side.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY = "ready.json"
ENDED = "ended.json"
STOP = "stop"
REQUESTS = "requests"
RESPONSES = "responses"
LOGS = "logs"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
POLL_S = 0.1
# polar-rollout flags that configure the serve itself (its proxy, sandbox, slots, preflight), not one of its runs: a
# client holding a polar-rollout command line (polar-train's --rollout-opt) passes these to `polar-rollout serve`
# and the rest to each request's `extra_args`. A flag without "=" takes the next argument, except the switches.
SERVE_FLAGS = ("--sandbox", "--image", "--parallel", "--confdir", "--npm-dir", "--skip-preflight", "--proxy-set",
               "--turn-states")
SERVE_SWITCHES = ("--skip-preflight",)

_seq = itertools.count(1)


class ServeEnded(RuntimeError):
    """The serve ended (or its process is gone) before the answer came; str() is the serve's own line."""


# ------------------------------------------------------------------------------------------------ the messages

# A field's JSON kind: "str", "str?", "int?", "float?", "bool", "strs" (a list of strings).
_REQUEST_KINDS = {"tasks": "strs", "out": "str", "agent": "str?", "samples": "int?", "parallel": "int?",
                  "run_id": "str?", "resume": "bool", "agent_timeout": "float?", "verify_timeout": "float?",
                  "model": "str?", "image": "str?", "retry_infra": "int?", "no_process": "bool",
                  "process_opt": "strs", "sft_min_reward": "float?", "sandbox": "str?", "extra_args": "strs",
                  "log": "str?"}


@dataclass(frozen=True)
class RolloutRequest:
    """One polar-rollout run; each field means what polar-rollout's flag of that name means (None: its default).
    `extra_args` are more polar-rollout flags, parsed as polar-rollout parses them (e.g. polar-train's
    --rollout-opt); `sandbox`, when given, must be the serve's; `log` is where the run's lines go."""

    out: str
    tasks: tuple[str, ...] = ()
    agent: str | None = None
    samples: int | None = None
    parallel: int | None = None
    run_id: str | None = None
    resume: bool = False
    agent_timeout: float | None = None
    verify_timeout: float | None = None
    model: str | None = None
    image: str | None = None
    retry_infra: int | None = None
    no_process: bool = False
    process_opt: tuple[str, ...] = ()
    sft_min_reward: float | None = None
    sandbox: str | None = None
    extra_args: tuple[str, ...] = ()
    log: str | None = None

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, doc: Any) -> RolloutRequest:
        """The request in `doc`; ValueError (one line naming the field) for anything else."""
        return cls(**_checked(doc, _REQUEST_KINDS, required=("out",)))

    def argv(self) -> list[str]:
        """polar-rollout's command line for this run (without a backend: the serve's proxy serves it)."""
        flags = [("--agent", self.agent), ("--out", self.out), ("--samples", self.samples),
                 ("--parallel", self.parallel), ("--run-id", self.run_id), ("--agent-timeout", self.agent_timeout),
                 ("--verify-timeout", self.verify_timeout), ("--model", self.model), ("--image", self.image),
                 ("--retry-infra", self.retry_infra), ("--sft-min-reward", self.sft_min_reward),
                 ("--sandbox", self.sandbox)]
        argv = [*self.tasks]
        argv += [part for flag, v in flags if v is not None for part in (flag, repr(v) if isinstance(v, float)
                                                                           else str(v))]
        argv += ["--resume"] * self.resume + ["--no-process"] * self.no_process
        argv += [f"--process-opt={opt}" for opt in self.process_opt]
        return argv + list(self.extra_args)


_RESPONSE_KINDS = {"name": "str", "exit": "int", "seconds": "float", "out": "str?", "error": "str?", "log": "str?",
                   "t_start": "float", "t_end": "float"}


@dataclass(frozen=True)
class RolloutResponse:
    """The end of one request: polar-rollout's exit code (0, 1, 2, 130), how long it took, its RUN, the one line
    saying why it failed (None on exit 0), where its lines are."""

    name: str
    exit: int
    seconds: float
    out: str | None
    error: str | None
    log: str | None
    t_start: float
    t_end: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> RolloutResponse:
        return cls(**_checked(doc, _RESPONSE_KINDS, required=tuple(_RESPONSE_KINDS)))


@dataclass(frozen=True)
class Ready:
    """ready.json: the serve's process, its proxy (port, pid, the run file with its hold/release endpoints), the
    flow directory every run's records land in, the sandbox it serves, its sample slots, the preflight that passed,
    and its --turn-states mode (every run it serves snapshots so, or none does)."""

    pid: int
    pid_start: int | None
    port: int
    proxy_pid: int | None
    proxy_json: str
    flows: str
    ca_pem: str
    upstream: str
    sandbox: str
    slots: int
    preflight: dict
    started: float
    turn_states: str = "off"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> Ready:
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return cls(**{f.name: doc[f.name] for f in dataclasses.fields(cls) if f.name in doc},
                   **{f.name: None for f in dataclasses.fields(cls)
                      if f.name not in doc and f.default is dataclasses.MISSING})


def _checked(doc: Any, kinds: dict[str, str], required: tuple[str, ...]) -> dict:
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(kinds))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(kinds)})")
    missing = [k for k in required if k not in doc or doc[k] is None and not kinds[k].endswith("?")]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    out = {}
    for key, value in doc.items():
        kind = kinds[key]
        if value is None and kind.endswith("?"):
            out[key] = None
        elif kind == "strs" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[key] = tuple(value)
        elif kind.rstrip("?") == "str" and isinstance(value, str) or kind == "bool" and isinstance(value, bool) \
                or kind.rstrip("?") == "int" and isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
        elif kind.rstrip("?") == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
        else:
            want = {"strs": "a list of strings", "bool": "true or false"}.get(kind, kind.rstrip("?"))
            raise ValueError(f"field {key}: expected {want}{' or null' if kind.endswith('?') else ''}, got "
                             f"{json.dumps(value)[:60]}")
    return out


# ------------------------------------------------------------------------------------------------ files

def write_json_atomic(path: Path, doc: Any) -> None:
    """`doc` as JSON at `path`, whole or not at all: written under a hidden temporary name, then renamed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_seq)}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _read(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def request_path(directory: str | os.PathLike, name: str) -> Path:
    return Path(directory) / REQUESTS / f"{name}.json"


def response_path(directory: str | os.PathLike, name: str) -> Path:
    return Path(directory) / RESPONSES / f"{name}.json"


def ended(directory: str | os.PathLike) -> dict | None:
    """ended.json once the serve has ended, else None."""
    doc = _read(Path(directory) / ENDED)
    return doc if isinstance(doc, dict) else None


def pid_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process `pid`, None when it is gone or a zombie: a pid and its
    start time name one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


# ------------------------------------------------------------------------------------------------ the client

def submit(directory: str | os.PathLike, request: RolloutRequest, name: str | None = None) -> str:
    """Ask the serve of `directory` for one run; returns the request's name (a new one unless given)."""
    name = name or f"r{time.time_ns()}-{os.getpid()}-{next(_seq)}"
    if not NAME.fullmatch(name):
        raise ValueError(f"request name {name!r}: use letters, digits, '.', '_' and '-'")
    if request_path(directory, name).exists() or response_path(directory, name).exists():
        raise FileExistsError(f"request {name} exists in {directory}; choose another name")
    (Path(directory) / REQUESTS).mkdir(parents=True, exist_ok=True)
    write_json_atomic(request_path(directory, name), request.to_json())
    return name


def poll(directory: str | os.PathLike, name: str) -> RolloutResponse | None:
    """The answer to request `name`, or None while it runs (or waits)."""
    doc = _read(response_path(directory, name))
    return None if doc is None else RolloutResponse.from_json(doc)


def request_stop(directory: str | os.PathLike) -> None:
    """Ask the serve to end (the stop file); `wait_ended` waits for it."""
    (Path(directory) / STOP).touch()


def _gone(directory: str | os.PathLike, pid: int | None, start: int | None, since: float | None) -> str | None:
    """Why the serve will not answer (it ended, or its process is gone), or None while it lives. With `pid`, an
    ended.json of another pid is an earlier serve's; with `since`, so is one written before it."""
    doc = ended(directory)
    if doc is not None and (pid is None or doc.get("pid") == pid) and (since is None or (doc.get("t") or 0) >= since):
        return f"the serve of {directory} ended (exit {doc.get('exit')}): {doc.get('reason')}"
    if pid is not None:
        now = pid_start(pid)
        if now is None or start is not None and now != start:
            time.sleep(POLL_S)  # an exit writes ended.json just before the process ends: look once more
            doc = ended(directory)
            why = f": {doc.get('reason')}" if doc and doc.get("pid") == pid else " without a word (killed?)"
            return f"the serve of {directory} (pid {pid}) is gone{why}"
    return None


def wait_ready(directory: str | os.PathLike, timeout: float, pid: int | None = None) -> Ready:
    """ready.json once the serve has started its proxy and passed its preflight. ServeEnded when it ended first
    (its reason is the line it refused with) or when process `pid` (the serve, when the caller started it) is gone;
    TimeoutError after `timeout` seconds."""
    since, deadline = time.time(), time.monotonic() + timeout
    start = pid_start(pid) if pid is not None else None
    while True:
        doc = _read(Path(directory) / READY)
        if doc is not None and (pid is None or doc.get("pid") == pid):
            return Ready.from_json(doc)
        why = _gone(directory, pid, start, since)
        if why:
            raise ServeEnded(why)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the serve of {directory} was not ready after {timeout:g} s")
        time.sleep(POLL_S)


def wait(directory: str | os.PathLike, name: str, timeout: float | None = None) -> RolloutResponse:
    """The answer to request `name` once it has come. ServeEnded when the serve ended (or its process is gone)
    without answering; TimeoutError after `timeout` seconds (None: no limit). Call it once `wait_ready` has
    returned: before, an ended.json an earlier serve of DIR left would count."""
    deadline = None if timeout is None else time.monotonic() + timeout
    ready = _read(Path(directory) / READY) or {}
    pid, start = ready.get("pid"), ready.get("pid_start")
    while True:
        got = poll(directory, name)
        if got is not None:
            return got
        why = _gone(directory, pid, start, None)
        if why:
            got = poll(directory, name)  # answered just before it ended
            if got is not None:
                return got
            raise ServeEnded(why)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"request {name} of the serve of {directory}: no answer after {timeout:g} s")
        time.sleep(POLL_S)


def wait_ended(directory: str | os.PathLike, timeout: float) -> dict:
    """ended.json once the serve has ended; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (doc := ended(directory)) is None:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the serve of {directory} had not ended after {timeout:g} s")
        time.sleep(POLL_S)
    return doc
