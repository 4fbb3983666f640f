"""The rollout runner: tasks → K samples of an unmodified agent, each in a sandbox → verified rewards → trainer batches.

One run lives in one directory RUN:

    RUN/run.json          run id, the run's options, the proxy (pid, port), the preflight that passed
    RUN/results.jsonl     one line per attempt, appended as it ends (RESULT_FIELDS); a sample's latest line decides
    RUN/rewards.jsonl     polar-process's rewards, rewritten from results.jsonl just before processing
    RUN/samples/<task>/<k>/<attempt>/{agent.stdout, agent.stderr, final.diff, verifier/, verifier.log, sample.json}
    RUN/flows/            the flow records of the proxy the runner started (--upstream)
    RUN/out/              polar-process's outputs (one --session-prefix per task: preflight sessions left out)
    RUN/summary.json      the end-of-run summary (statuses, rewards, whether the rewards are isolation-safe)

Identity: session `<run-id>/<task-id>/<k>/<attempt>`, group `<run-id>/<task-id>`. A sample's status follows the table
below; only the statuses with a reward reach rewards.jsonl (and so the advantages):

    completed       agent exit 0, ≥ 1 call with token ids     verified     the verifier's reward
    agent_error     non-zero exit after ≥ 1 call with ids     verified     the verifier's reward
    agent_timeout   the agent ran out of time                 —            0.0
    verifier_timeout  the verifier ran out of time            —            0.0
    infra_error     no call with token ids, a sandbox or proxy failure     none
    verifier_error  no / malformed / non-finite reward                     none
    cancelled       Ctrl-C, or the runner died (found at --resume)         none

results.jsonl's `calls` is the number of the attempt's model calls (records of its session), `trainable_tokens` the
tokens the model sampled in them; "a call with token ids" (the agent_error / infra_error line) is a record whose
completion has token ids.

Samples run on a thread pool (`--engine local`) or as Ray tasks (`--engine ray`); every result line is written by
this process, so results.jsonl has one writer.
"""

from __future__ import annotations

import base64
import contextlib
import difflib
import fcntl
import http.client
import json
import math
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import quote

from polar import records as rec
from polar.launch import ca, paths, process, runfiles
from polar.launch import proxy as launch_proxy
from polar.launch.runfiles import ProxyRunFile, RunFileError, VllmRunFile
from polar.rollout import agents as agentlib

VERSION = 1
RESULT_FIELDS = ("run_id", "session", "group", "task", "k", "attempt", "agent", "sandbox", "status", "reward",
                 "reward_details", "agent_exit", "calls", "trainable_tokens", "t_start", "t_end", "timings", "error")
STATUSES = ("completed", "agent_error", "agent_timeout", "verifier_timeout", "verifier_error", "infra_error",
            "cancelled")
REWARDED = frozenset({"completed", "agent_error", "agent_timeout", "verifier_timeout"})
PREFLIGHT = "preflight"  # sessions <run-id>/preflight/0 (canary call) and /1 (canary sample); a reserved task id
DEFAULT_AGENT_TIMEOUT = 600.0
DEFAULT_VERIFY_TIMEOUT = 600.0
CANARY_TIMEOUT = 180.0
CANARY_INSTRUCTION = ("This is a connectivity check before a rollout. Do not use any tool; reply with the single "
                      "word: ok")
CANARY_HOST = "api.openai.com"
# Paths inside the sandbox (the sandbox itself puts the sample's workdir at /app and HOME at /home/agent).
IN_VENV = "/opt/polar/venv"
IN_LIB = "/opt/polar/lib"
IN_AGENT_DIR = "/opt/polar/agent"
IN_NPM = "/opt/polar/npm"
IN_TESTS = "/tests"
IN_VERIFIER = "/logs/verifier"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DIFF_FILE_LIMIT = 1 << 20
DIFF_TOTAL_LIMIT = 16 << 20

CANCEL = threading.Event()  # set on Ctrl-C / SIGTERM: running samples end as `cancelled`, no new one starts


class UsageError(Exception):
    """Bad input, or a preflight that refused: one line, exit 2."""


class Cancelled(Exception):
    pass


# ------------------------------------------------------------------------------------------------ small helpers

def now() -> float:
    return time.time()


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def session_of(run_id: str, task: str, k: int, attempt: int) -> str:
    return f"{run_id}/{task}/{k}/{attempt}"


def group_of(run_id: str, task: str) -> str:
    return f"{run_id}/{task}"


def proxy_url(port: int, session: str) -> str:
    return f"http://{quote(session, safe='')}:x@127.0.0.1:{port}"


def tail(path: Path, n: int = 800) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - n))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


is_alive = process.alive  # a zombie is not alive


def is_our_proxy(pid: int | None) -> bool:
    return process.is_ours(pid, process.PROXY_MARKER)


def stop_process_group(pid: int, grace: float = 5.0) -> None:
    """SIGTERM the process group led by `pid` (a proxy: it closes and renames its flow files), SIGKILL after `grace`."""
    process.kill_group(pid, grace)


def kill_children(spare: Iterable[int] = ()) -> None:
    """SIGKILL the process group of every child of this process but `spare`: each sandbox is a session of its own
    (the sandbox module starts them with start_new_session), so this ends every running sample at once. The
    runner's own proxy is a child too, spared: it must close its flow files on a clean stop."""
    me, spare = os.getpid(), set(spare)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and int(entry) not in spare:
            pid = int(entry)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)


def remove_containers(run_id: str) -> int:
    """docker rm -f every container labelled polar-run=<run-id> (a dead attempt's); how many there were."""
    exe = shutil.which("docker")
    if not exe:
        return 0
    try:
        p = subprocess.run([exe, "ps", "-aq", "--filter", f"label=polar-run={run_id}"], capture_output=True,
                           text=True, timeout=30, stdin=subprocess.DEVNULL)
        ids = p.stdout.split() if p.returncode == 0 else []
        if ids:
            subprocess.run([exe, "rm", "-f", *ids], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        return len(ids)
    except (OSError, subprocess.TimeoutExpired):
        return 0


def close_dead_writers(flows: Path) -> list[str]:
    """Close the `.open` files of writers that are gone (this host, pid not a live proxy): cut back to their last
    whole record and renamed to `.msgpack` (`polar.records.close_dead_writers`). Returns their names."""
    return rec.close_dead_writers(str(flows), alive=is_our_proxy)


# ------------------------------------------------------------------------------------------------ flow counting

class FlowCounter:
    """Per session: records, records with token ids, sampled tokens — read with the record module's reader from the
    flow directory. A file is re-read only when its size changed (a renamed `.open` file is read once more)."""

    def __init__(self, flows: Path):
        self.flows = flows
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, dict[str, list[int]]]] = {}

    def _refresh(self) -> None:
        try:
            paths = rec.expand_inputs([str(self.flows)]) if self.flows.is_dir() else []
        except FileNotFoundError:
            paths = []
        seen = set()
        for path in paths:
            seen.add(path)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if path in self._files and self._files[path][0] == size:
                continue
            per: dict[str, list[int]] = {}
            try:
                for _, r in rec.iter_file(path, raw=True):
                    s = r.get("session")
                    if not isinstance(s, str):
                        continue
                    c = per.setdefault(s, [0, 0, 0])
                    c[0] += 1
                    ids = r.get("completion_token_ids")
                    if isinstance(ids, bytes) and len(ids) >= 4:
                        c[1] += 1
                        c[2] += len(ids) // 4
            except (OSError, rec.SchemaError):
                continue
            self._files[path] = (size, per)
        for gone in set(self._files) - seen:
            del self._files[gone]

    def counts(self, session: str) -> tuple[int, int, int]:
        """(calls, calls with token ids, sampled tokens) of `session`."""
        with self._lock:
            self._refresh()
            out = [0, 0, 0]
            for _, per in self._files.values():
                for i, v in enumerate(per.get(session, (0, 0, 0))):
                    out[i] += v
            return out[0], out[1], out[2]

    def records(self, session: str, since: float = 0.0) -> list[dict]:
        """The session's records as stored (not normalized), in file order, from files written since `since`."""
        out = []
        paths = rec.expand_inputs([str(self.flows)]) if self.flows.is_dir() else []
        for path in paths:
            with contextlib.suppress(OSError, rec.SchemaError):
                if os.path.getmtime(path) < since:
                    continue
                out.extend(r for _, r in rec.iter_file(path, raw=True) if r.get("session") == session)
        return out


_COUNTERS: dict[str, FlowCounter] = {}
_COUNTERS_LOCK = threading.Lock()


def flow_counter(flows: str | Path) -> FlowCounter:
    """One counter per flow directory and process (its per-file cache is shared by the samples)."""
    key = os.path.abspath(flows)
    with _COUNTERS_LOCK:
        if key not in _COUNTERS:
            _COUNTERS[key] = FlowCounter(Path(key))
        return _COUNTERS[key]


# ------------------------------------------------------------------------------------------------ results file

class Results:
    """RUN/results.jsonl: read (a torn last line is reported and ignored, and cut before the next append), append."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self.torn: str | None = None

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        data = self.path.read_bytes()
        lines, out = data.split(b"\n"), []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if not isinstance(doc, dict):
                    raise ValueError("not an object")
                out.append(doc)
            except ValueError:
                if i == len(lines) - 1:  # the last line, without its newline: a write cut short
                    self.torn = f"{self.path}: a torn last line ({len(line)} bytes) is ignored"
                    continue
                raise UsageError(f"{self.path} line {i + 1} is not a JSON object; fix or remove it") from None
        return out

    def repair(self) -> None:
        """Cut a torn last line, so the next append starts on a line of its own."""
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as fh:
                fh.truncate(cut)

    def append(self, line: dict) -> None:
        doc = {k: line.get(k) for k in RESULT_FIELDS}
        blob = (json.dumps(doc, allow_nan=False) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, blob)
                os.fsync(fd)
            finally:
                os.close(fd)


def latest_by_sample(lines: Iterable[dict]) -> dict[tuple[str, int], dict]:
    """Each sample's latest line (the highest attempt; the later line for the same attempt)."""
    out: dict[tuple[str, int], dict] = {}
    for line in lines:
        key = (line.get("task"), line.get("k"))
        old = out.get(key)
        if old is None or (line.get("attempt") or 0) >= (old.get("attempt") or 0):
            out[key] = line
    return out


def rewards_lines(lines: Iterable[dict]) -> list[dict]:
    """rewards.jsonl: the latest attempt per sample, rewarded statuses only, reward exactly as in results."""
    out = []
    for _, line in sorted(latest_by_sample(lines).items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        if line.get("status") in REWARDED and line.get("reward") is not None:
            out.append({"session": line["session"], "reward": line["reward"], "group": line["group"]})
    return out


# ------------------------------------------------------------------------------------------------ verifier reward

def read_reward(verifier_dir: Path) -> tuple[float | None, Any, str | None]:
    """(reward, reward_details, error): reward.json's `reward` (else its only key), else reward.txt's one float."""
    j, t = verifier_dir / "reward.json", verifier_dir / "reward.txt"
    if j.is_file():
        try:
            doc = json.loads(j.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return None, None, f"reward.json is not JSON ({exc})"
        value: Any = doc
        if isinstance(doc, dict):
            if "reward" in doc:
                value = doc["reward"]
            elif len(doc) == 1:
                value = next(iter(doc.values()))
            else:
                return None, doc, f"reward.json has no `reward` key and {len(doc)} keys (expected one)"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None, doc if isinstance(doc, dict) else None, f"reward.json's reward {value!r} is not a finite number"
        return float(value), doc if isinstance(doc, dict) else None, None
    if t.is_file():
        try:
            text = t.read_text(encoding="utf-8").strip()
            value = float(text)
        except (OSError, ValueError):
            return None, None, f"reward.txt holds {t.read_text(errors='replace').strip()[:80]!r}, not one number"
        if not math.isfinite(value):
            return None, None, f"reward.txt's reward {text!r} is not finite"
        return value, None, None
    return None, None, "the verifier wrote no reward.json or reward.txt in /logs/verifier"


# ------------------------------------------------------------------------------------------------ final.diff

def _files(root: Path | None) -> dict[str, Path]:
    out: dict[str, Path] = {}
    if root is None or not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git" or dirpath != str(root))
        for name in filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = p
    return out


def _text(path: Path) -> list[str] | None:
    try:
        if path.is_symlink():
            return [f"-> {os.readlink(path)}\n"]
        if path.stat().st_size > DIFF_FILE_LIMIT:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def tree_diff(start: Path | None, final: Path) -> str:
    """A unified diff of the start state against the final /app (text files; binary or large files named)."""
    a, b = _files(start), _files(final)
    out: list[str] = []
    size = 0
    for rel in sorted(set(a) | set(b)):
        old, new = (_text(a[rel]) if rel in a else []), (_text(b[rel]) if rel in b else [])
        if rel in a and rel in b and old is not None and old == new:
            continue
        if old is None or new is None:
            if rel in a and rel in b:
                with contextlib.suppress(OSError):
                    if a[rel].read_bytes() == b[rel].read_bytes():
                        continue
            out.append(f"Binary or large files a/{rel} and b/{rel} differ\n")
            continue
        chunk = list(difflib.unified_diff(old, new, f"a/{rel}" if rel in a else "/dev/null",
                                          f"b/{rel}" if rel in b else "/dev/null"))
        chunk = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in chunk]
        size += sum(map(len, chunk))
        if size > DIFF_TOTAL_LIMIT:
            out.append(f"... diff cut at {DIFF_TOTAL_LIMIT} bytes\n")
            break
        out.extend(chunk)
    return "".join(out)


# ------------------------------------------------------------------------------------------------ the agent

@dataclass(frozen=True)
class AgentSpec:
    text: str
    kind: str  # "cli" or "python"
    harness: str | None = None
    provider: str | None = None
    target: str | None = None  # MODULE:FUNC

    @classmethod
    def parse(cls, text: str) -> "AgentSpec":
        if text.startswith("python:"):
            target = text[len("python:"):]
            module, sep, func = target.partition(":")
            if not sep or not re.fullmatch(r"[A-Za-z_][\w.]*", module or "") or \
                    not re.fullmatch(r"[A-Za-z_][\w.]*", func or ""):
                raise UsageError(f"--agent {text}: expected python:MODULE:FUNC (e.g. python:agent:run)")
            return cls(text, "python", target=target)
        try:
            harness, provider = agentlib.parse_agent(text)
        except ValueError as exc:
            raise UsageError(f"--agent: {exc}") from None
        return cls(text, "cli", harness=harness, provider=provider)


# ------------------------------------------------------------------------------------------------ a sample

@dataclass
class SampleContext:
    """Everything a sample needs, picklable (a Ray task gets it whole)."""

    run_id: str
    run_dir: str
    agent: AgentSpec
    sandbox: str
    image: str
    model: str | None
    proxy_port: int
    ca_pem: str
    ca_bundle: str
    flows: str
    venv: str
    npm_dir: str
    agent_timeout: float | None
    verify_timeout: float | None


@dataclass
class SampleJob:
    task: Any  # tasks.Task
    k: int
    attempt: int
    canary: bool = False  # the preflight's one-turn sample: no verifier, no results line

    @property
    def key(self) -> tuple[str, int]:
        return (self.task.id, self.k)


def _job_paths(ctx: SampleContext, job: SampleJob) -> tuple[str, Path, Path]:
    run = Path(ctx.run_dir)
    if job.canary:
        session = f"{ctx.run_id}/{PREFLIGHT}/1"
        return session, run / PREFLIGHT / "sample", run / ".work" / "preflight-1"
    session = session_of(ctx.run_id, job.task.id, job.k, job.attempt)
    return (session, run / "samples" / job.task.id / str(job.k) / str(job.attempt),
            run / ".work" / f"{job.task.id}-{job.k}-{job.attempt}")


def _copy_tree(src: Path | None, dst: Path) -> None:
    if src is not None and src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        dst.mkdir(parents=True)


def _host_env() -> dict[str, str]:
    """--sandbox none: the runner's environment minus what would move the agent off the proxy or out of its HOME."""
    drop = set(agentlib.DROP_VARS) | set(agentlib.HOME_VARS) | {
        "HTTPS_PROXY", "https_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
        "CODEX_CA_CERTIFICATE", "PYTHONPATH", "VIRTUAL_ENV", "POLAR_SESSION", "POLAR_SAMPLE"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def agent_command(ctx: SampleContext, job: SampleJob, session: str, app: Path, home: Path,
                  instruction: str) -> tuple[list[str], dict[str, str], tuple]:
    """(argv, env, mounts) of the agent in the sample's sandbox."""
    from polar.rollout import sandbox as sb

    boxed = ctx.sandbox != "none"
    home_in = sb.HOME if boxed else str(home)
    ca_pem, bundle = f"{home_in}/.polar/ca.pem", f"{home_in}/.polar/ca-bundle.pem"
    env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"} if boxed else _host_env()
    env.update({"TERM": "dumb", "NO_COLOR": "1", "CI": "1", "POLAR_SAMPLE": str(job.k), "POLAR_SESSION": session,
                "POLAR_RUN_ID": ctx.run_id, "POLAR_TASK": job.task.id, "POLAR_APP": sb.APP if boxed else str(app)})
    if job.canary:
        env["POLAR_PREFLIGHT"] = "1"
    if ctx.model:
        env["POLAR_MODEL"] = ctx.model
    if boxed:
        env["IS_SANDBOX"] = "1"  # Claude Code: --dangerously-skip-permissions is allowed in a sandbox
    proxy = proxy_url(ctx.proxy_port, session)  # the sandbox points HTTPS_PROXY at its relay instead
    mounts: list = []
    if ctx.agent.kind == "python":
        instr = home / ".polar" / "instruction.md"
        instr.write_text(instruction, encoding="utf-8")
        if boxed:
            mounts.append(sb.Mount(Path(ctx.venv), IN_VENV, False))
            # Only the agent-side modules, never the repository: pyagent and the SDK agent the demo uses.
            for name in ("pyagent.py", "sdk_agent.py"):
                mounts.append(sb.Mount(Path(__file__).with_name(name), f"{IN_LIB}/polar/rollout/{name}", False))
            python = f"{IN_VENV}/bin/python"
            env["PATH"] = f"{IN_VENV}/bin:{SANDBOX_PATH}"
            env["PYTHONPATH"] = IN_LIB
            if job.task.agent_dir is not None:
                mounts.append(sb.Mount(Path(job.task.agent_dir), IN_AGENT_DIR, False))
                env["POLAR_AGENT_DIR"] = IN_AGENT_DIR
        else:
            python = str(Path(ctx.venv) / "bin" / "python")
            if job.task.agent_dir is not None:
                env["POLAR_AGENT_DIR"] = str(job.task.agent_dir)
        env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1",
                    "HTTPS_PROXY": proxy, "https_proxy": proxy, "SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle,
                    "NODE_EXTRA_CA_CERTS": ca_pem, "CODEX_CA_CERTIFICATE": bundle})
        env.pop("SSL_CERT_DIR", None)
        argv = [python, "-m", "polar.rollout.pyagent", ctx.agent.target or "",
                "--instruction-file", f"{home_in}/.polar/instruction.md"]
        return argv, env, tuple(mounts)
    binary_name = agentlib.BINARIES[ctx.agent.harness]
    if boxed:
        mounts.append(sb.Mount(Path(ctx.npm_dir), IN_NPM, False))
        binary = f"{agentlib.npm_bin_dir(IN_NPM)}/{binary_name}"
        env["POLAR_NPM_DIR"] = IN_NPM
    else:
        binary = agentlib.find_binary(binary_name, ctx.npm_dir) or binary_name
    args = agentlib.cli_args(ctx.agent.harness, instruction, provider=ctx.agent.provider, model=ctx.model)
    argv, env = agentlib.build(args, env, proxy, ca_pem, bundle, session)
    return [binary, *argv], env, tuple(mounts)


def _fresh_dirs(ctx: SampleContext, job: SampleJob, work: Path) -> tuple[Path, Path]:
    """(app, home) of a new attempt: a fresh copy of the start state, and a HOME holding the proxy's CA files."""
    if work.exists():
        shutil.rmtree(work, ignore_errors=True)
    app, home = work / "app", work / "home"
    _copy_tree(None if job.canary else job.task.workdir, app)
    (home / ".polar").mkdir(parents=True)
    shutil.copyfile(ctx.ca_pem, home / ".polar" / "ca.pem")
    shutil.copyfile(ctx.ca_bundle, home / ".polar" / "ca-bundle.pem")
    return app, home


def run_sample(ctx: SampleContext, job: SampleJob) -> dict:
    """One attempt of one sample, start to end: setup, agent, verifier, teardown. Never raises: the result line."""
    from polar.rollout import sandbox as sb

    session, sample_dir, work = _job_paths(ctx, job)
    result: dict[str, Any] = {
        "run_id": ctx.run_id, "session": session, "group": group_of(ctx.run_id, job.task.id), "task": job.task.id,
        "k": job.k, "attempt": job.attempt, "agent": ctx.agent.text, "sandbox": ctx.sandbox, "status": None,
        "reward": None, "reward_details": None, "agent_exit": None, "calls": 0, "trainable_tokens": 0,
        "t_start": now(), "t_end": None, "timings": {"setup": 0.0, "agent": 0.0, "verify": 0.0, "teardown": 0.0},
        "error": None}
    detail: dict[str, Any] = {"paths": {"sample": str(sample_dir), "work": str(work)}}
    timings = result["timings"]
    counter = flow_counter(ctx.flows)
    phase_t = time.monotonic()

    def lap(name: str) -> None:
        nonlocal phase_t
        t = time.monotonic()
        timings[name] = round(timings[name] + t - phase_t, 3)
        phase_t = t

    def check_cancel() -> None:
        if CANCEL.is_set():
            raise Cancelled()

    try:
        sample_dir.mkdir(parents=True, exist_ok=True)
        check_cancel()
        app, home = _fresh_dirs(ctx, job, work)
        instruction = CANARY_INSTRUCTION if job.canary else job.task.instruction
        argv, env, mounts = agent_command(ctx, job, session, app, home, instruction)
        agent_timeout = (min(CANARY_TIMEOUT, ctx.agent_timeout or CANARY_TIMEOUT) if job.canary else
                         ctx.agent_timeout or job.task.agent_timeout_sec or DEFAULT_AGENT_TIMEOUT)
        spec = sb.SandboxSpec(kind=ctx.sandbox, app=app, home=home, mounts=mounts, env=env,
                              proxy_port=ctx.proxy_port, session=session, memory_mb=job.task.memory_mb,
                              cpus=job.task.cpus, image=ctx.image, label=ctx.run_id)
        detail["agent"] = {"argv": argv, "env": _shown_env(env), "mounts": [[str(m.host), m.inside, m.writable]
                                                                            for m in mounts],
                           "timeout_s": agent_timeout}
        lap("setup")
        check_cancel()
        try:
            res = sb.run_sandboxed(spec, argv, stdout=sample_dir / "agent.stdout", stderr=sample_dir / "agent.stderr",
                                   timeout=agent_timeout)
        finally:
            lap("agent")
        check_cancel()
        detail["agent"].update(exit_code=res.exit_code, timed_out=res.timed_out, wall_s=round(res.wall_s, 3),
                               memory_limit=res.memory_limit)
        result["agent_exit"] = res.exit_code
        calls, with_ids, tokens = counter.counts(session)
        result["calls"], result["trainable_tokens"] = calls, tokens
        detail["calls_with_token_ids"] = with_ids
        if not job.canary:
            (sample_dir / "final.diff").write_text(tree_diff(job.task.workdir, app), encoding="utf-8")
        _agent_status(ctx, result, res, calls, with_ids, agent_timeout)
        if result["status"] in ("completed", "agent_error") and not job.canary:
            _verify(ctx, job, result, detail, sample_dir, work, app, lap)
    except Cancelled:
        result["status"], result["reward"] = "cancelled", None
        result["error"] = "cancelled (Ctrl-C or SIGTERM)"
        with contextlib.suppress(Exception):  # what the attempt did before it was cut (its records stay)
            result["calls"], _, result["trainable_tokens"] = counter.counts(session)
    except sb.SandboxError as exc:
        result["status"], result["reward"] = "infra_error", None
        result["error"] = f"sandbox: {exc}"
    except Exception as exc:  # noqa: BLE001 — a runner bug must not take the run down: infra, with the traceback
        result["status"], result["reward"] = "infra_error", None
        result["error"] = f"runner: {type(exc).__name__}: {exc}"
        detail["traceback"] = traceback.format_exc()
    finally:
        if CANCEL.is_set() and result["status"] in (None, "infra_error"):  # a sandbox killed by the cancel
            result["status"], result["reward"], result["error"] = "cancelled", None, "cancelled (Ctrl-C or SIGTERM)"
        shutil.rmtree(work, ignore_errors=True)
        lap("teardown")
        result["t_end"] = now()
        with contextlib.suppress(OSError):
            write_json(sample_dir / "sample.json", {**result, **detail})
    return result


def _agent_status(ctx: SampleContext, result: dict, res, calls: int, with_ids: int, agent_timeout: float) -> None:
    """The status the agent's run gives (the table in the module docstring), before any verifier."""
    if with_ids == 0:
        why = ("timed out" if res.timed_out else f"exited with code {res.exit_code}")
        result["status"] = "infra_error"
        result["error"] = (f"no call with token ids: the agent {why} after {calls} call(s), none with token ids"
                           f"{_proxy_hint(ctx)}")
    elif res.timed_out:
        result["status"], result["reward"] = "agent_timeout", 0.0
        result["error"] = f"the agent did not finish within {agent_timeout:g} s"
    else:
        result["status"] = "completed" if res.exit_code == 0 else "agent_error"
        if res.exit_code != 0:
            result["error"] = f"the agent exited with code {res.exit_code}"


def _verify(ctx: SampleContext, job: SampleJob, result: dict, detail: dict, sample_dir: Path, work: Path, app: Path,
            lap: Callable[[str], None]) -> None:
    """The verifier on a fresh copy of the final /app; sets status/reward/reward_details (the status table)."""
    from polar.rollout import sandbox as sb

    boxed = ctx.sandbox != "none"
    vapp, vhome = work / "verify-app", work / "verify-home"
    shutil.copytree(app, vapp, symlinks=True)
    vhome.mkdir()
    vdir = sample_dir / "verifier"
    if vdir.exists():
        shutil.rmtree(vdir)
    vdir.mkdir()
    if boxed and os.geteuid() == 0:
        os.chown(vdir, sb.UID, sb.GID)  # /logs/verifier is written by uid 1000 inside
    elif boxed:
        os.chmod(vdir, 0o777)
    tests = Path(job.task.tests_dir)
    if boxed:
        env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "POLAR_APP": sb.APP,
               "POLAR_TESTS": IN_TESTS, "POLAR_LOGS": IN_VERIFIER}
        mounts = (sb.Mount(tests, IN_TESTS, False), sb.Mount(vdir, IN_VERIFIER, True))
        argv = ["bash", f"{IN_TESTS}/test.sh"]
    else:  # no mount namespace: the verifier finds its directories in these variables
        env = _host_env()
        env.update({"POLAR_APP": str(vapp), "POLAR_TESTS": str(tests), "POLAR_LOGS": str(vdir),
                    "PATH": os.pathsep.join([str(Path(ctx.venv) / "bin"), env.get("PATH", SANDBOX_PATH)])})
        mounts = ()
        argv = ["bash", str(tests / "test.sh")]
    env.update({"POLAR_SAMPLE": str(job.k), "POLAR_TASK": job.task.id})
    timeout = ctx.verify_timeout or job.task.verifier_timeout_sec or DEFAULT_VERIFY_TIMEOUT
    spec = sb.SandboxSpec(kind=ctx.sandbox, app=vapp, home=vhome, mounts=mounts, env=env, proxy_port=None,
                          session=None, memory_mb=job.task.memory_mb, cpus=job.task.cpus, image=ctx.image,
                          label=ctx.run_id)
    lap("setup")
    log = sample_dir / "verifier.log"
    try:
        res = sb.run_sandboxed(spec, argv, stdout=log, stderr=sample_dir / ".verifier.stderr", timeout=timeout)
    finally:
        lap("verify")
        _join_logs(log, sample_dir / ".verifier.stderr")
    if CANCEL.is_set():
        raise Cancelled()
    detail["verifier"] = {"argv": argv, "exit_code": res.exit_code, "timed_out": res.timed_out,
                          "wall_s": round(res.wall_s, 3), "timeout_s": timeout, "memory_limit": res.memory_limit}
    if res.timed_out:
        result["status"], result["reward"] = "verifier_timeout", 0.0
        result["error"] = f"the verifier did not finish within {timeout:g} s"
        return
    reward, details, error = read_reward(vdir)
    result["reward_details"] = details
    if error is not None:
        result["status"], result["reward"] = "verifier_error", None
        result["error"] = f"{error} (verifier exit {res.exit_code}; verifier.log: {tail(log, 300)!r})"
        return
    result["reward"] = reward


def _join_logs(log: Path, err: Path) -> None:
    """verifier.log: the verifier's stdout then its stderr (the sandbox writes them to two files)."""
    with contextlib.suppress(OSError):
        if err.is_file():
            data = err.read_bytes()
            if data:
                with open(log, "ab") as fh:
                    fh.write(b"\n--- stderr\n" + data)
            err.unlink()


def _shown_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("<dummy key>" if k.endswith("_API_KEY") else v) for k, v in sorted(env.items())}


def _proxy_hint(ctx: SampleContext) -> str:
    info = probe_ready(ctx.proxy_port, timeout=2.0)
    if info is None:
        return f"; the proxy on port {ctx.proxy_port} does not answer its readiness probe"
    return ""


def probe_ready(port: int, timeout: float = 3.0) -> dict | None:
    """The gateway's readiness answer (`http://polar.gateway/ready` through the proxy), or None."""
    return launch_proxy.health(port, timeout)


# ------------------------------------------------------------------------------------------------ options

@dataclass
class Options:
    tasks: list[str]
    agent: str
    out: str
    samples: int | None = None  # None: 4 (or the resumed run's)
    parallel: int = 0  # 0: the machine's cores
    sandbox: str | None = None  # None: bwrap (or the resumed run's)
    image: str | None = None
    model: str | None = None
    agent_timeout: float | None = None
    verify_timeout: float | None = None
    proxy_set: list[str] = field(default_factory=list)
    upstream: str | None = None
    proxy_json: str | None = None
    run_id: str | None = None
    resume: bool = False
    retry_infra: int = 0
    no_process: bool = False
    process_opt: list[str] = field(default_factory=list)
    sft_min_reward: float | None = None
    skip_preflight: bool = False
    engine: str | None = None  # None: local (or the resumed run's)
    ray_address: str | None = None
    progress: bool | None = None
    confdir: str | None = None  # None: polar.launch.paths.confdir (outside a checkout, $POLAR_CONFDIR)
    npm_dir: str | None = None  # None: polar.launch.paths.npm_dir (outside a checkout, $POLAR_NPM_DIR)


# Options a resumed run must keep (its identity), and the ones it takes from run.json unless given again.
IDENTITY = ("tasks", "agent", "samples", "sandbox")
REUSED = ("parallel", "image", "model", "agent_timeout", "verify_timeout", "proxy_set", "upstream", "proxy_json",
          "retry_infra", "no_process", "process_opt", "sft_min_reward", "engine", "ray_address", "confdir", "npm_dir")


# ------------------------------------------------------------------------------------------------ the proxy

@dataclass
class Proxy:
    port: int
    ca_pem: str
    ca_bundle: str
    flows: str
    own: bool
    pid: int | None = None
    run_dir: str | None = None  # the own proxy's run directory (RUN/proxy)
    info: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {"own": self.own, "pid": self.pid, "port": self.port, "run_dir": self.run_dir, "flows": self.flows,
                "ca_pem": self.ca_pem, "ca_bundle": self.ca_bundle}


def start_proxy(run_dir: Path, upstream: str, sets: list[str], confdir: str | None = None) -> Proxy:
    """The runner's own proxy: run file, logs and CA bundle in RUN/proxy, flows in RUN/flows. It is a child of this
    process (in its own process group), so `kill_children` must spare it."""
    pdir = run_dir / "proxy"
    try:
        started = launch_proxy.start(upstream, flows=run_dir / "flows", run_dir=pdir, sets=sets, confdir=confdir)
    except launch_proxy.ProxyError as exc:
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        raise UsageError(f"the proxy did not start ({' | '.join(lines[-3:]) or f'exit {exc.code}'})") from None
    for line in started.notes:
        print(f"polar-rollout: {line.lstrip('# ')}", file=sys.stderr)
    s = started.state
    return Proxy(port=s.port, ca_pem=s.ca_pem, ca_bundle=s.ca_bundle, flows=s.flows, own=True, pid=s.pid,
                 run_dir=str(pdir))


def stop_proxy(proxy: Proxy | None) -> None:
    if proxy is None or not proxy.own or proxy.pid is None:
        return
    if is_our_proxy(proxy.pid):
        stop_process_group(proxy.pid)
    if proxy.run_dir:
        runfiles.remove(paths.proxy_run_file(proxy.run_dir))


def external_proxy(path: Path) -> Proxy:
    try:
        state = ProxyRunFile.read(path)
    except RunFileError as exc:
        raise UsageError(f"--proxy-json {path}: not a proxy run file of polar-proxy ({exc})") from None
    if state is None:
        raise UsageError(f"--proxy-json {path}: cannot read it (no such file)")
    if state.port is None or not state.ca_pem or not state.flows:
        raise UsageError(f"--proxy-json {path}: not a proxy run file of polar-proxy (needs port, ca_pem, flows)")
    proxy = Proxy(port=state.port, ca_pem=state.ca_pem, ca_bundle=state.ca_bundle or "", flows=state.flows,
                  own=False, pid=state.pid)
    if not proxy.ca_bundle or not os.path.isfile(proxy.ca_bundle):
        proxy.ca_bundle = ca.bundle(proxy.ca_pem, str(Path(path).parent))
    return proxy


# ------------------------------------------------------------------------------------------------ progress

class Progress:
    """samples done/total, mean reward, statuses, ETA — a bar on a terminal, one line per sample otherwise."""

    def __init__(self, total: int, enabled: bool | None, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if enabled is None else enabled
        self.total, self.done = total, 0
        self.statuses: dict[str, int] = {}
        self.rewards: list[float] = []
        self.running = 0
        self.t0 = time.monotonic()
        self._drawn = 0.0

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * 24)
        mean = f"{sum(self.rewards) / len(self.rewards):.3f}" if self.rewards else "-"
        elapsed = time.monotonic() - self.t0
        eta = (elapsed / self.done * (self.total - self.done)) if self.done else None
        sts = " ".join(f"{s} {n}" for s, n in sorted(self.statuses.items()))
        run = f" · {self.running} running" if self.running else ""
        return (f"[{bar:<24}] {self.done}/{self.total} samples{run} · mean reward {mean} · {sts or '-'} · "
                f"{_duration(elapsed)} · ETA {_duration(eta) if eta is not None else '?'}")

    def tick(self, running: int) -> None:
        """Redraw the bar (a terminal only) at most once a second: the running count and the clock move."""
        self.running = running
        if self.tty and time.monotonic() - self._drawn >= 1.0:
            self._drawn = time.monotonic()
            self.stream.write(f"\r{self.line()}\033[K")
            self.stream.flush()

    def update(self, result: dict) -> None:
        self.done += 1
        self.running = max(0, self.running - 1)
        s = result.get("status") or "?"
        self.statuses[s] = self.statuses.get(s, 0) + 1
        if result.get("reward") is not None and s in REWARDED:
            self.rewards.append(result["reward"])
        if self.tty:
            self.stream.write(f"\r{self.line()}\033[K")
        else:
            reward = "-" if result.get("reward") is None else f"{result['reward']:g}"
            err = f" ({result['error'][:160]})" if result.get("error") and s not in ("completed",) else ""
            self.stream.write(f"polar-rollout: {result['task']}/{result['k']}/{result['attempt']}: {s}, reward "
                              f"{reward}{err} — {self.line()}\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


# ------------------------------------------------------------------------------------------------ the run

class Runner:
    def __init__(self, opts: Options):
        self.opts = opts
        self.run_dir = Path(os.path.abspath(opts.out))
        self.results = Results(self.run_dir / "results.jsonl")
        self.proxy: Proxy | None = None
        self.run_doc: dict = {}
        self.tasks: list = []
        self.agent: AgentSpec | None = None
        self._lock_fd: int | None = None
        self.cancelled = False
        self.notes: list[str] = []

    # -- entry ------------------------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run()
        except UsageError as exc:
            print(f"polar-rollout: error: {exc}", file=sys.stderr)
            return 2
        finally:
            stop_proxy(self.proxy)
            if self._lock_fd is not None:
                os.close(self._lock_fd)

    def _run(self) -> int:
        self._prepare()
        self._start_proxy()
        self._preflight()
        jobs, done_before = self._plan()
        total = len(self.tasks) * self.opts.samples
        progress = Progress(total, self.opts.progress)
        progress.done = done_before
        for line in latest_by_sample(self.results.read()).values():
            if (line["task"], line["k"]) not in {j.key for j in jobs}:
                progress.statuses[line["status"]] = progress.statuses.get(line["status"], 0) + 1
                if line.get("reward") is not None and line["status"] in REWARDED:
                    progress.rewards.append(line["reward"])
        if jobs:
            print(f"polar-rollout: run {self.run_doc['run_id']}: {len(jobs)} sample(s) to run of {total} "
                  f"({len(self.tasks)} task(s) × {self.opts.samples}), agent {self.agent.text}, sandbox "
                  f"{self.opts.sandbox}, --parallel {self.opts.parallel}, engine {self.opts.engine}", file=sys.stderr)
        self._execute(jobs, progress)
        progress.end()
        stop_proxy(self.proxy)  # its flow files are closed (renamed .msgpack) before processing
        lines = self.results.read()
        self._write_rewards(lines)
        if self.cancelled:
            print(f"polar-rollout: cancelled; results and records kept in {self.run_dir} (continue with --resume)",
                  file=sys.stderr)
            self._summary(lines, None)
            return 130
        processed = None if self.opts.no_process else self._process()
        if processed is not None:  # what polar-train reads (exit, seconds, counts); the command stays in process.log
            self.run_doc["processed"] = {k: v for k, v in processed.items() if k != "command"}
            self._save_run_doc()
        return self._summary(lines, processed)

    # -- RUN, run.json, tasks -------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        from polar.rollout import tasks as tasklib

        o = self.opts
        doc_path = self.run_dir / "run.json"
        if o.resume:
            if not doc_path.is_file():
                raise UsageError(f"--resume: {self.run_dir} has no run.json (nothing to resume); drop --resume to "
                                 f"start a run there")
            try:
                prev = read_json(doc_path)
            except (OSError, ValueError) as exc:
                raise UsageError(f"--resume: {doc_path} is unreadable ({exc})") from None
            self._merge_resume(prev)
        elif self.run_dir.exists() and (not self.run_dir.is_dir() or any(self.run_dir.iterdir())):
            raise UsageError(f"--out {self.run_dir} is not empty; pass --resume to continue the run there, or choose "
                             f"another directory")
        o.samples = 4 if o.samples is None else o.samples
        o.sandbox = o.sandbox or "bwrap"
        o.engine = o.engine or "local"
        self._check_options()
        try:
            self.tasks = tasklib.load_tasks(o.tasks, allow_image=o.sandbox == "docker" and bool(o.image))
        except tasklib.TaskError as exc:
            raise UsageError(str(exc)) from None
        for t in self.tasks:
            if t.id == PREFLIGHT:
                raise UsageError(f"task {t.id} ({t.path}): the id {PREFLIGHT!r} is reserved for the runner's "
                                 f"preflight sessions; rename the directory")
        if self.agent.kind == "python" and o.sandbox != "none" and sys.prefix == sys.base_prefix:
            raise UsageError("python: agents run with the runner's virtual environment, and this interpreter is not "
                             "in one; run polar-rollout from .venv")
        from polar.rollout import sandbox as sb

        why = sb.available(o.sandbox)
        if why:
            raise UsageError(f"--sandbox {o.sandbox}: {why}")
        if o.resume:
            self._check_identity()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        removed, killed = sb.sweep_stale_controls()
        if removed:
            print(f"polar-rollout: removed {removed} sandbox control dir(s) of dead runs"
                  + (f", killed {killed} process(es) their agents left" if killed else ""), file=sys.stderr)
        if o.resume:
            self._clean_dead_attempt()
        else:
            from polar.records import uuid7

            run_id = o.run_id or uuid7()
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", run_id):
                raise UsageError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-' (it starts every "
                                 f"session id)")
            self.run_doc = {"version": VERSION, "run_id": run_id, "created": now()}
        self.run_doc.update(
            tasks=[t.id for t in self.tasks], task_paths={t.id: str(t.path) for t in self.tasks},
            agent=o.agent, samples=o.samples, sandbox=o.sandbox,
            isolation_safe=o.sandbox != "none",
            options={k: getattr(o, k) for k in REUSED}, runner_pid=os.getpid(), updated=now())
        self.run_doc.setdefault("preflight", None)
        self._save_run_doc()

    def _check_options(self) -> None:
        """Each option on its own and against the others (UsageError names the one that is wrong)."""
        o = self.opts
        if not o.tasks:
            raise UsageError("no TASKS given (task directories or folders holding them)")
        if not o.agent:
            raise UsageError("--agent is required (claude-code, codex, gemini-cli, qwen-code, pi[:provider] or "
                             "python:MODULE:FUNC)")
        self.agent = AgentSpec.parse(o.agent)
        if o.samples < 1:
            raise UsageError(f"--samples must be at least 1 (got {o.samples})")
        if o.parallel < 0:
            raise UsageError(f"--parallel must be at least 1 (got {o.parallel})")
        o.parallel = o.parallel or os.cpu_count() or 1
        if o.retry_infra < 0:
            raise UsageError(f"--retry-infra must be 0 or more (got {o.retry_infra})")
        for name in ("agent_timeout", "verify_timeout"):
            v = getattr(o, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise UsageError(f"--{name.replace('_', '-')} must be a positive number of seconds (got {v})")
        if o.sandbox not in ("bwrap", "docker", "none"):
            raise UsageError(f"--sandbox must be bwrap, docker or none (got {o.sandbox})")
        if o.image and o.sandbox != "docker":
            raise UsageError("--image applies to --sandbox docker only")
        if o.engine not in ("local", "ray"):
            raise UsageError(f"--engine must be local or ray (got {o.engine})")
        if o.ray_address and o.engine != "ray":
            raise UsageError("--ray-address needs --engine ray")
        if o.upstream and o.proxy_json:
            raise UsageError("pass one of --upstream URL (the runner starts its proxy) or --proxy-json FILE "
                             "(a running proxy), not both")
        if o.proxy_set and o.proxy_json:
            raise UsageError("--proxy-set applies to the proxy the runner starts (--upstream), not to a "
                             "--proxy-json proxy")
        for item in o.proxy_set:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise UsageError(f"--proxy-set {item!r}: expected NAME=VALUE")
            if name.strip() == "polar_other_hosts" and o.sandbox != "none" and value.strip() != "refuse":
                raise UsageError(f"--proxy-set {item}: sandboxed runs need polar_other_hosts=refuse (their one path "
                                 f"out is the proxy, which must serve provider hosts only)")
            if name.strip() == "polar_flows":
                raise UsageError("--proxy-set polar_flows: the runner's proxy writes to RUN/flows")

    def _merge_resume(self, prev: dict) -> None:
        """--resume: take the run's options from run.json, unless given again; its identity must match."""
        o = self.opts
        self.run_doc = prev
        if not o.tasks:
            o.tasks = list((prev.get("task_paths") or {}).values())
        if not o.agent:
            o.agent = prev.get("agent")
        if o.samples is None:
            o.samples = prev.get("samples")
        if o.sandbox is None:
            o.sandbox = prev.get("sandbox")
        saved = dict(prev.get("options") or {})
        if o.upstream or o.proxy_json:  # a backend given again replaces the run's, whichever kind it was
            saved.pop("upstream", None)
            saved.pop("proxy_json", None)
        for k in REUSED:
            if getattr(o, k) in (None, [], False, 0) and saved.get(k) not in (None, [], False):
                setattr(o, k, saved[k])
        if o.run_id and o.run_id != prev.get("run_id"):
            raise UsageError(f"--resume: --run-id {o.run_id} differs from the run's {prev.get('run_id')}")

    def _check_identity(self) -> None:
        prev = self.run_doc
        diffs = []
        if [t.id for t in self.tasks] != prev.get("tasks"):
            diffs.append(f"tasks {prev.get('tasks')} → {[t.id for t in self.tasks]}")
        for k in ("agent", "samples", "sandbox"):
            if getattr(self.opts, k) != prev.get(k):
                diffs.append(f"--{k} {prev.get(k)!r} → {getattr(self.opts, k)!r}")
        if diffs:
            raise UsageError(f"--resume: the run in {self.run_dir} was started with other options ({'; '.join(diffs)})"
                             f"; resume with the same ones, or start a new run in another --out")

    def _lock(self) -> None:
        fd = os.open(self.run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UsageError(f"another polar-rollout runs on {self.run_dir} (its lock is held)") from None
        self._lock_fd = fd

    def _save_run_doc(self) -> None:
        write_json(self.run_dir / "run.json", self.run_doc)

    def _clean_dead_attempt(self) -> None:
        """--resume: stop a live proxy of the previous attempt, remove its containers, close dead writers' .open
        files, mark attempts that never got a line as cancelled, and forget its scratch directories."""
        prev = self.run_doc.get("proxy") or {}
        if prev.get("own") and is_our_proxy(prev.get("pid")):
            stop_process_group(prev["pid"])
            self.notes.append(f"stopped the previous attempt's proxy (pid {prev['pid']}, port {prev.get('port')})")
            if prev.get("run_dir"):
                runfiles.remove(paths.proxy_run_file(prev["run_dir"]))
        if self.opts.sandbox == "docker":
            n = remove_containers(self.run_doc["run_id"])
            if n:
                self.notes.append(f"removed {n} container(s) labelled polar-run={self.run_doc['run_id']}")
        closed = close_dead_writers(self.run_dir / "flows")
        if closed:
            self.notes.append(f"closed {len(closed)} flow file(s) of a dead writer")
        self.results.read()
        if self.results.torn:
            print(f"polar-rollout: warning: {self.results.torn}", file=sys.stderr)
        self.results.repair()
        lines = self.results.read()
        have = {(ln.get("task"), ln.get("k"), ln.get("attempt")) for ln in lines}
        samples = self.run_dir / "samples"
        run_id = self.run_doc["run_id"]
        counter = flow_counter((self.run_doc.get("proxy") or {}).get("flows") or self.run_dir / "flows")
        for task_dir in sorted(samples.iterdir()) if samples.is_dir() else []:
            for k_dir in sorted(task_dir.iterdir(), key=lambda p: p.name):
                for a_dir in sorted(k_dir.iterdir(), key=lambda p: p.name):
                    if not (k_dir.name.isdigit() and a_dir.name.isdigit()):
                        continue
                    key = (task_dir.name, int(k_dir.name), int(a_dir.name))
                    if key in have:
                        continue
                    t = a_dir.stat().st_mtime
                    self.results.append({
                        "run_id": run_id, "session": session_of(run_id, *key), "group": group_of(run_id, key[0]),
                        "task": key[0], "k": key[1], "attempt": key[2], "agent": self.run_doc.get("agent"),
                        "sandbox": self.run_doc.get("sandbox"), "status": "cancelled", "reward": None,
                        "t_start": t, "t_end": t, "timings": {"setup": 0.0, "agent": 0.0, "verify": 0.0,
                                                              "teardown": 0.0},
                        "calls": counter.counts(session_of(run_id, *key))[0],
                        "trainable_tokens": 0,
                        "error": "the runner stopped before this attempt ended (found at --resume)"})
                    self.notes.append(f"attempt {'/'.join(map(str, key))} had no result line: marked cancelled")
        shutil.rmtree(self.run_dir / ".work", ignore_errors=True)
        for note in self.notes:
            print(f"polar-rollout: resume: {note}", file=sys.stderr)

    # -- the proxy ------------------------------------------------------------------------------------------------
    def _start_proxy(self) -> None:
        o = self.opts
        boxed = o.sandbox != "none"
        upstream, proxy_json = o.upstream, o.proxy_json
        if not upstream and not proxy_json:
            default, vllm = paths.proxy_run_file(), paths.vllm_run_file()
            if default.is_file():
                proxy_json = str(default)
            elif vllm.is_file():
                with contextlib.suppress(RunFileError, AttributeError):
                    upstream = VllmRunFile.read(vllm).base_url
            if not upstream and not proxy_json:
                raise UsageError("no model backend: pass --upstream URL (an OpenAI /v1 base URL of vLLM or SGLang; "
                                 "the runner starts its proxy) or --proxy-json FILE (a running polar-proxy)")
        if upstream:
            sets = list(o.proxy_set)
            if boxed and not any(s.split("=", 1)[0].strip() == "polar_other_hosts" for s in sets):
                sets.append("polar_other_hosts=refuse")
            self.proxy = start_proxy(self.run_dir, upstream, sets, o.confdir)
        else:
            self.proxy = external_proxy(Path(proxy_json))
        info = probe_ready(self.proxy.port)
        if not info or not info.get("ready"):
            why = (info or {}).get("error") or "no readiness answer"
            raise UsageError(f"the proxy on port {self.proxy.port} is not ready ({why})")
        self.proxy.info = info
        if boxed and info.get("other_hosts") != "refuse":
            raise UsageError(f"the proxy on port {self.proxy.port} ({proxy_json}) does not refuse non-provider hosts "
                             f"(readiness says other_hosts: {info.get('other_hosts', 'unknown')!r}); a sandboxed run "
                             f"needs one started with --set polar_other_hosts=refuse, or pass --upstream URL")
        if self.proxy.own is False and os.path.abspath(self.proxy.flows) != os.path.abspath(info.get("flows") or
                                                                                           self.proxy.flows):
            self.proxy.flows = info["flows"]
        self.run_doc["proxy"] = self.proxy.describe()
        self.run_doc["proxy"].update(exact=info.get("exact"), other_hosts=info.get("other_hosts"),
                                     version=info.get("version"), upstream=info.get("upstream"))
        self._save_run_doc()

    def _context(self) -> SampleContext:
        o, p = self.opts, self.proxy
        assert p is not None and self.agent is not None
        npm = paths.npm_dir(o.npm_dir)
        if npm is None and self.agent.kind != "python" and o.sandbox != "none":  # the sandbox mounts it
            raise UsageError(f"--agent {o.agent}: {paths.missing('npm_dir')}")
        return SampleContext(
            run_id=self.run_doc["run_id"], run_dir=str(self.run_dir), agent=self.agent, sandbox=o.sandbox,
            image=o.image or "polar-sandbox:1", model=o.model, proxy_port=p.port, ca_pem=p.ca_pem,
            ca_bundle=p.ca_bundle, flows=p.flows, venv=sys.prefix, npm_dir=str(npm or ""),
            agent_timeout=o.agent_timeout, verify_timeout=o.verify_timeout)

    # -- preflight ------------------------------------------------------------------------------------------------
    def _preflight(self) -> None:
        prev = self.run_doc.get("preflight")
        if self.opts.skip_preflight:
            if not (isinstance(prev, dict) and prev.get("passed")):
                print("polar-rollout: warning: --skip-preflight: no preflight has passed in this RUN; the backend's "
                      "token ids and the sandbox are not checked", file=sys.stderr)
            return
        ctx = self._context()
        run_id = ctx.run_id
        t0 = time.monotonic()
        self._canary_call(f"{run_id}/{PREFLIGHT}/0")
        self._canary_sample(ctx)
        self.run_doc["preflight"] = {"passed": True, "t": now(), "seconds": round(time.monotonic() - t0, 2)}
        self._save_run_doc()
        print(f"polar-rollout: preflight passed ({time.monotonic() - t0:.1f} s): the backend returns token ids and "
              f"logprobs, the {self.opts.sandbox} sandbox starts, the agent reaches the proxy", file=sys.stderr)

    def _canary_call(self, session: str) -> None:
        p = self.proxy
        assert p is not None
        body = json.dumps({"model": "polar-preflight", "messages": [{"role": "user", "content": "Say ok."}],
                           "max_tokens": 8, "stream": False}).encode()
        ctx = ssl.create_default_context(cafile=p.ca_pem)
        auth = base64.b64encode(f"{quote(session, safe='')}:x".encode()).decode()
        conn = http.client.HTTPSConnection("127.0.0.1", p.port, timeout=120, context=ctx)
        t0 = now()
        try:
            conn.set_tunnel(CANARY_HOST, 443, headers={"Proxy-Authorization": f"Basic {auth}"})
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json",
                                                                "authorization": f"Bearer {agentlib.DUMMY_KEY}"})
            resp = conn.getresponse()
            answer = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise UsageError(f"preflight: the canary call through the proxy on port {p.port} failed ({exc})") from None
        finally:
            conn.close()
        if resp.status != 200:
            msg = answer.decode("utf-8", "replace")
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                msg = json.loads(answer)["error"]["message"]
            raise UsageError(f"preflight: the canary call was answered {resp.status} ({msg[:300]}); is the backend "
                             f"at {p.info.get('upstream')} up?")
        records = FlowCounter(Path(p.flows)).records(session, since=t0 - 5)
        if not records:
            raise UsageError(f"preflight: the canary call left no record in {p.flows} (session {session})")
        r = records[-1]
        ids = rec.token_ids(r, "completion_token_ids")
        lps = rec.unpack_floats(r.get("completion_logprobs"))
        prompt = r.get("prompt_token_ids") or r.get("prompt_tail_ids")
        if not ids or not isinstance(prompt, bytes):
            raise UsageError(f"preflight: the backend at {p.info.get('upstream')} returned no token ids (canary "
                             f"record {r.get('id')}); RL needs them: use vLLM ≥ 0.10 or SGLang, and check "
                             f"polar_backend")
        if not lps or len(lps) != len(ids):
            raise UsageError(f"preflight: the backend at {p.info.get('upstream')} returned no logprobs for the "
                             f"sampled tokens (canary record {r.get('id')}); RL needs them")

    def _canary_sample(self, ctx: SampleContext) -> None:
        job = SampleJob(self.tasks[0], 0, 0, canary=True)
        result = run_sample(ctx, job)
        session = result["session"]
        if CANCEL.is_set():
            raise KeyboardInterrupt
        if result["status"] in ("completed", "agent_error"):
            return
        sdir = self.run_dir / PREFLIGHT / "sample"
        err = tail(sdir / "agent.stderr", 300)
        if result["status"] == "infra_error" and (result.get("error") or "").startswith("sandbox:"):
            raise UsageError(f"preflight: the {ctx.sandbox} sandbox did not start ({result['error'][9:]})")
        info = probe_ready(ctx.proxy_port) or {}
        failures = (info.get("tls_failures") or {}).get(session)
        if failures:
            raise UsageError(f"preflight: the agent ({self.agent.text}) does not trust the proxy's CA: {failures} "
                             f"TLS handshake(s) of session {session} failed (agent.stderr: {err!r})")
        if result["status"] == "agent_timeout":
            raise UsageError(f"preflight: the canary sample timed out (session {session}; {sdir})")
        raise UsageError(f"preflight: the agent ({self.agent.text}) made no call with token ids through the proxy in "
                         f"its canary sample (session {session}, exit {result.get('agent_exit')}; {result['error']}; "
                         f"agent.stderr: {err!r})")

    # -- which samples run ------------------------------------------------------------------------------------------
    def _plan(self) -> tuple[list[SampleJob], int]:
        """The attempts to run: samples with no line, `cancelled` ones, `infra_error` ones with retries left."""
        lines = self.results.read()
        if self.results.torn:
            print(f"polar-rollout: warning: {self.results.torn}", file=sys.stderr)
            self.results.repair()
        latest = latest_by_sample(lines)
        infra: dict[tuple[str, int], int] = {}
        next_attempt: dict[tuple[str, int], int] = {}
        for ln in lines:
            key = (ln.get("task"), ln.get("k"))
            next_attempt[key] = max(next_attempt.get(key, 0), (ln.get("attempt") or 0) + 1)
            if ln.get("status") == "infra_error":
                infra[key] = infra.get(key, 0) + 1
        jobs, done = [], 0
        for k in range(self.opts.samples):
            for task in self.tasks:
                key = (task.id, k)
                line = latest.get(key)
                status = line.get("status") if line else None
                rerun = line is None or status == "cancelled" or (
                    status == "infra_error" and infra.get(key, 0) <= self.opts.retry_infra)
                if rerun:
                    jobs.append(SampleJob(task, k, self._next_attempt(key, next_attempt.get(key, 0))))
                else:
                    done += 1
        jobs.sort(key=lambda j: ([t.id for t in self.tasks].index(j.task.id), j.k))
        return jobs, done

    def _next_attempt(self, key: tuple[str, int], after: int) -> int:
        """Past every attempt with a line and every attempt directory (a killed one may have left records)."""
        kdir = self.run_dir / "samples" / key[0] / str(key[1])
        seen = [int(p.name) + 1 for p in kdir.iterdir() if p.name.isdigit()] if kdir.is_dir() else []
        return max([after, *seen])

    # -- running ----------------------------------------------------------------------------------------------------
    def _execute(self, jobs: list[SampleJob], progress: Progress) -> None:
        if not jobs:
            return
        ctx = self._context()
        pending = list(jobs)
        infra_count: dict[tuple[str, int], int] = {}
        for ln in self.results.read():
            if ln.get("status") == "infra_error":
                key = (ln["task"], ln["k"])
                infra_count[key] = infra_count.get(key, 0) + 1

        def finished(job: SampleJob, result: dict) -> SampleJob | None:
            self.results.append(result)
            progress.update(result)
            if result["status"] == "infra_error" and not CANCEL.is_set():
                infra_count[job.key] = infra_count.get(job.key, 0) + 1
                if infra_count[job.key] <= self.opts.retry_infra:
                    progress.done -= 1  # the sample is not done: it runs again
                    return SampleJob(job.task, job.k, job.attempt + 1)
            return None

        old = _install_cancel_handlers()
        try:
            if self.opts.engine == "ray":
                self._execute_ray(ctx, pending, finished, progress)
            else:
                self._execute_local(ctx, pending, finished, progress)
        except KeyboardInterrupt:
            self.cancelled = True
        finally:
            _restore_handlers(old)
        if CANCEL.is_set():
            self.cancelled = True

    def _execute_local(self, ctx: SampleContext, pending: list[SampleJob],
                       finished: Callable[[SampleJob, dict], SampleJob | None], progress: Progress) -> None:
        running: dict[Future, SampleJob] = {}
        with ThreadPoolExecutor(max_workers=self.opts.parallel, thread_name_prefix="sample") as pool:
            try:
                while pending or running:
                    while pending and len(running) < self.opts.parallel and not CANCEL.is_set():
                        job = pending.pop(0)
                        running[pool.submit(run_sample, ctx, job)] = job
                    if not running:
                        break
                    progress.tick(len(running))
                    done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                    for fut in done:
                        job = running.pop(fut)
                        again = finished(job, fut.result())
                        if again is not None:
                            pending.insert(0, again)
            except KeyboardInterrupt:
                CANCEL.set()
                _cancel_sandboxes(ctx)
                for fut in list(running):
                    job = running.pop(fut)
                    try:
                        result = fut.result(timeout=60)
                    except Exception:  # noqa: BLE001
                        continue
                    self.results.append(result)
                raise

    def _execute_ray(self, ctx: SampleContext, pending: list[SampleJob],
                     finished: Callable[[SampleJob, dict], SampleJob | None], progress: Progress) -> None:
        try:
            import ray
        except ImportError:
            raise UsageError("--engine ray needs Ray: pip install 'polar-gateway[ray]'") from None
        init = {"address": self.opts.ray_address} if self.opts.ray_address else {
            "num_cpus": max(self.opts.parallel, os.cpu_count() or 1)}
        ray.init(**init, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 configure_logging=False)
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            if len(nodes) > 1:
                raise UsageError(f"--engine ray: the cluster has {len(nodes)} nodes; this runner serves samples from "
                                 f"one proxy on this node, so it runs on one node only")
            remote = ray.remote(num_cpus=1, max_retries=0)(_ray_sample)
            running: dict[Any, SampleJob] = {}
            try:
                while pending or running:
                    while pending and len(running) < self.opts.parallel and not CANCEL.is_set():
                        job = pending.pop(0)
                        running[remote.remote(ctx, job)] = job
                    if not running:
                        break
                    progress.tick(len(running))
                    done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                    for ref in done:
                        job = running.pop(ref)
                        try:
                            result = ray.get(ref)
                        except Exception as exc:  # noqa: BLE001 — the worker died: infrastructure
                            session, _, _ = _job_paths(ctx, job)
                            result = _failed_result(ctx, job, session, f"ray task failed: {exc}")
                        again = finished(job, result)
                        if again is not None:
                            pending.insert(0, again)
            except KeyboardInterrupt:
                CANCEL.set()
                for ref, job in running.items():
                    ray.cancel(ref, force=True)
                    session, _, _ = _job_paths(ctx, job)
                    self.results.append({**_failed_result(ctx, job, session, "cancelled (Ctrl-C or SIGTERM)"),
                                         "status": "cancelled"})
                _cancel_sandboxes(ctx)
                raise
        finally:
            ray.shutdown()

    # -- after the samples ------------------------------------------------------------------------------------------
    def _write_rewards(self, lines: list[dict]) -> None:
        path = self.run_dir / "rewards.jsonl"
        tmp = path.with_name(f"rewards.jsonl.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for item in rewards_lines(lines):
                fh.write(json.dumps(item, allow_nan=False) + "\n")
        os.replace(tmp, path)

    def _process(self) -> dict:
        """polar-process over the flows, this run's task sessions only (one --session-prefix per task)."""
        o, p = self.opts, self.proxy
        assert p is not None
        out = self.run_dir / "out"
        cmd = [sys.executable, "-m", "polar.processor.cli", p.flows, "-o", str(out), "--overwrite", "--rewards",
               str(self.run_dir / "rewards.jsonl"), "--no-progress"]
        for t in self.tasks:
            cmd += ["--session-prefix", f"{self.run_doc['run_id']}/{t.id}/"]
        if o.sft_min_reward is not None:
            cmd += ["--sft-min-reward", repr(o.sft_min_reward)]
        cmd += list(o.process_opt)  # e.g. --process-opt=--engine=ray: the processor's engine is its own choice
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        (self.run_dir / "process.log").write_text(f"$ {shlex.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
        for line in proc.stderr.splitlines():
            if line.strip():
                print(line, file=sys.stderr)
        doc = {"exit": proc.returncode, "seconds": round(time.monotonic() - t0, 2), "out": str(out),
               "command": cmd}
        if proc.returncode == 0:
            with contextlib.suppress(OSError, ValueError):
                report = read_json(out / "report.json")
                doc["report"] = {"sequences": report["counts"]["sequences"], "calls": report["counts"]["calls"],
                                 "sessions": report["counts"]["sessions"],
                                 "sessions_other_prefix": report["counts"].get("sessions_other_prefix"),
                                 "trainable_tokens": report["tokens"]["trainable"],
                                 "merge_ratio": report["merge_ratio"], "batches": report["outputs"]["batches"],
                                 "sft_lines": report["outputs"]["sft_lines"], "rewards": report["rewards"]}
        return doc

    def _summary(self, lines: list[dict], processed: dict | None) -> int:
        latest = latest_by_sample(lines)
        total = len(self.tasks) * self.opts.samples
        statuses: dict[str, int] = {}
        for ln in latest.values():
            statuses[ln["status"]] = statuses.get(ln["status"], 0) + 1
        rewarded = [ln for ln in latest.values() if ln["status"] in REWARDED and ln.get("reward") is not None]
        per_task = {}
        for t in self.tasks:
            rs = [ln["reward"] for ln in rewarded if ln["task"] == t.id]
            per_task[t.id] = {"rewarded": len(rs), "mean_reward": sum(rs) / len(rs) if rs else None,
                              "spread": len(set(rs)) > 1}
        mean = sum(ln["reward"] for ln in rewarded) / len(rewarded) if rewarded else None
        if self.cancelled:
            code = 130
        elif processed is not None and processed.get("exit") != 0:
            code = 1
        else:
            code = 0 if rewarded else 1
        doc = {"run_id": self.run_doc["run_id"], "samples": total, "finished": len(latest),
               "attempts": len(lines), "statuses": statuses, "rewarded": len(rewarded), "mean_reward": mean,
               "per_task": per_task, "sandbox": self.opts.sandbox, "isolation_safe": self.opts.sandbox != "none",
               "processed": processed, "exit_code": code, "cancelled": self.cancelled}
        if self.opts.sandbox == "none":
            doc["warning"] = ("--sandbox none: the rewards are not isolation-safe (the agent ran on the host: it "
                              "could read the tests and the solution and write anywhere)")
        write_json(self.run_dir / "summary.json", doc)
        out = [f"polar-rollout: run {doc['run_id']} — {len(self.tasks)} task(s) × K={self.opts.samples}, agent "
               f"{self.agent.text}, sandbox {self.opts.sandbox}",
               f"  samples   {len(latest)}/{total} with a status, {len(lines)} attempt(s): "
               + ", ".join(f"{s} {statuses[s]}" for s in STATUSES if s in statuses),
               f"  rewards   {len(rewarded)} rewarded, mean {mean:.3f}" if mean is not None else
               "  rewards   none"]
        groups = sum(1 for v in per_task.values() if v["spread"])
        out.append(f"  groups    {len(per_task)} ({groups} with a reward spread, i.e. non-zero advantages)")
        for tid, v in list(per_task.items())[:20]:
            m = f"{v['mean_reward']:.3f}" if v["mean_reward"] is not None else "-"
            out.append(f"    {tid:<32} rewarded {v['rewarded']}/{self.opts.samples}  mean {m}")
        if len(per_task) > 20:
            out.append(f"    … {len(per_task) - 20} more in {self.run_dir / 'summary.json'}")
        if processed is None:
            out.append("  processed skipped" + (" (--no-process)" if self.opts.no_process else ""))
        elif processed.get("exit") != 0:
            out.append(f"  processed FAILED (polar-process exit {processed['exit']}; {self.run_dir / 'process.log'})")
        elif processed.get("report"):
            r = processed["report"]
            out.append(f"  processed {r['sequences']} sequence(s) from {r['calls']} call(s) of {r['sessions']} "
                       f"session(s), {r['trainable_tokens']} trainable tokens, merge ratio "
                       f"{r['merge_ratio'] or 0:.2f}, {r['batches']} batch file(s) → {processed['out']}")
        out.append(f"  files     {self.run_dir / 'results.jsonl'}, {self.run_dir / 'rewards.jsonl'}")
        if "warning" in doc:
            out.append(f"  WARNING   {doc['warning']}")
        print("\n".join(out))
        return code


def _failed_result(ctx: SampleContext, job: SampleJob, session: str, error: str) -> dict:
    t = now()
    return {"run_id": ctx.run_id, "session": session, "group": group_of(ctx.run_id, job.task.id),
            "task": job.task.id, "k": job.k, "attempt": job.attempt, "agent": ctx.agent.text, "sandbox": ctx.sandbox,
            "status": "infra_error", "reward": None, "reward_details": None, "agent_exit": None, "calls": 0,
            "trainable_tokens": 0, "t_start": t, "t_end": t,
            "timings": {"setup": 0.0, "agent": 0.0, "verify": 0.0, "teardown": 0.0}, "error": error}


def _ray_sample(ctx: SampleContext, job: SampleJob) -> dict:
    return run_sample(ctx, job)


def _cancel_sandboxes(ctx: SampleContext) -> None:
    kill_children(spare=launch_proxy.started_pids())
    if ctx.sandbox == "docker":
        remove_containers(ctx.run_id)


def _install_cancel_handlers():
    """SIGTERM ends the run like Ctrl-C (KeyboardInterrupt in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, on_term)


def _restore_handlers(old) -> None:
    if old is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, old)


def main(opts: Options) -> int:
    CANCEL.clear()
    return Runner(opts).run()
