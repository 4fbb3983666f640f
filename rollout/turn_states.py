"""Workspace states at call boundaries (`polar-rollout --turn-states off|async|hold`, docs/options.md) and their scores
(a task's optional `tests/progress.sh`): what `polar-process --credit turn` reads as `turn_scores`.

When a sample's call reaches the gateway, its agent is blocked on the model and its working directory is the state
its last action left. The gateway announces the call (`polar_announce`: session and call id, over loopback with the
control token); `TurnStates` answers by snapshotting the sample's working directory — the files that differ from its
start (by size and modification time, or new) and the start's files that are gone — named by the call. `hold` has the
gateway wait for that answer (at most HOLD_S; a snapshot that took longer is marked late), `async` lets the call go
on: a snapshot then races the model's answer and whatever the agent runs in the background, so a fast answer acted on
at once can land in the call's snapshot.

After the sample, `score_turns` scores the snapshots of the session's main-chain calls (processor/main_chain.py) and
the final state: each in a sandbox like the verifier's, on the start state with the snapshot laid over it (an overlay
where the sample's own working directory was one, `state_view`: no copy of the start state; else a copy), with the
task's tests (copied in only then), running `tests/progress.sh`, which writes a score in [0, 1] where test.sh writes
its reward (reward.txt or reward.json in /logs/verifier); up to --parallel at once. Any boundary without a snapshot,
a scorer that exits non-zero, times out or writes no score in [0, 1] gives the whole session `turn_scores: null`
(session credit), never 0. Snapshots are deleted after scoring; their disk use is bounded per run (MAX_RUN_BYTES:
past it a call is not snapshotted, so its session is not scored).
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
import secrets
import shutil
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODES = ("off", "async", "hold")
HOLD_S = 30.0  # hold: the longest a call waits for its snapshot
MAX_RUN_BYTES = 2 << 30  # the snapshots' disk use per run
PROGRESS = "progress.sh"
ANNOUNCE_PATH = "/turn-states/call"
TOKEN_HEADER = "x-polar-control-token"
MAX_BODY = 64 * 1024


# ------------------------------------------------------------------------------------------------------ snapshots

def tree_stats(root: Path) -> dict[str, tuple[int, int, bool]]:
    """rel path → (size, mtime_ns, is_symlink) of every file and symlink under `root`."""
    out: dict[str, tuple[int, int, bool]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))]:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns, os.path.islink(path))
    return out


def take_snapshot(app: Path, start: dict[str, tuple[int, int, bool]], dest: Path) -> int:
    """What changed in `app` since `start` (its tree_stats then), into `dest` (files/ and deleted.json), written
    under a temporary name and renamed; returns the bytes copied."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    files = tmp / "files"
    files.mkdir(parents=True)
    now = tree_stats(app)
    copied = 0
    for rel, stat in now.items():
        if start.get(rel) == stat:
            continue
        src, dst = app / rel, files / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            if stat[2]:
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
                copied += stat[0]
        except OSError:
            continue  # gone between the walk and the copy: the next state has it right
    (tmp / "deleted.json").write_text(json.dumps(sorted(set(start) - set(now))))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return copied


def materialize(start: Path | None, snapshot: Path, into: Path) -> None:
    """The working directory a snapshot stands for: the start state, the deleted files removed, the changed laid
    over."""
    if start is not None and start.is_dir():
        shutil.copytree(start, into, symlinks=True)
    else:
        into.mkdir(parents=True)
    for rel in json.loads((snapshot / "deleted.json").read_text()):
        target = into / rel
        if target.is_symlink() or target.is_file():
            target.unlink()
    files = snapshot / "files"
    for dirpath, dirnames, filenames in os.walk(files):
        for name in [*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))]:
            src = Path(dirpath) / name
            rel = src.relative_to(files)
            for parent in reversed(rel.parents[:-1]):  # a file of the start state where a directory is now
                if (into / parent).is_symlink() or (into / parent).is_file():
                    (into / parent).unlink()
            dst = into / rel
            if dst.is_dir() and not dst.is_symlink():  # a directory of the start state where a file is now
                shutil.rmtree(dst)
            elif os.path.lexists(dst):
                dst.unlink()
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)


def state_view(start: Path, snapshot: Path, work: Path, name: str, owner: tuple[int, int] | None) -> Path:
    """`<work>/<name>`: the state a snapshot stands for as an overlay — the snapshot's files a layer over the start
    state, with a whiteout (overlayfs's 0/0 character device) for each deleted file, under a fresh upper layer — for
    a sample whose own working directory was an overlay (its start state already the sandbox uid's): nothing of the
    start state is copied. The snapshot's files are handed to `owner` (they are few: what changed)."""
    from polar.rollout import overlay
    from polar.rollout.sandbox.view import chown_tree

    layer = snapshot / "files"
    for rel in json.loads((snapshot / "deleted.json").read_text()):
        target = layer / rel
        if os.path.lexists(target):
            continue  # the snapshot's own entry there hides the start state's
        parents = [p for p in target.relative_to(layer).parents if str(p) != "."]
        if any(os.path.lexists(layer / p) and (os.path.islink(layer / p) or not (layer / p).is_dir())
               for p in parents):
            continue  # a file of the snapshot's stands where a directory was: it hides the whole directory
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    if owner is not None:
        chown_tree(layer, *owner)
    return overlay.mount_view([layer, start], work, name)


# ------------------------------------------------------------------------------------------------------ the server

@dataclass
class SampleStates:
    """One sample's snapshots: where its working directory is, what it started as, and each call's snapshot."""

    session: str
    app: Path
    directory: Path
    start: dict = field(default_factory=dict)
    calls: dict[str, dict] = field(default_factory=dict)  # call id → {"path", "seconds", "late", "bytes"}
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self, call_id: str, hold_s: float, budget: "Budget") -> dict:
        with self.lock:
            if not budget.room():
                meta = {"skipped": "the run's snapshot disk budget is spent"}
            else:
                t0 = time.monotonic()
                path = self.directory / f"call-{len(self.calls):04d}"
                size = take_snapshot(self.app, self.start, path)
                budget.add(size)
                seconds = time.monotonic() - t0
                meta = {"path": str(path), "seconds": round(seconds, 4), "bytes": size,
                        "late": hold_s > 0 and seconds > hold_s}
            self.calls.setdefault(call_id, meta)
            return meta


class Budget:
    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def room(self) -> bool:
        with self._lock:
            return self.used < self.limit

    def add(self, n: int) -> None:
        with self._lock:
            self.used += n


class TurnStates:
    """The run's announce endpoint (a loopback HTTP server checking the control token) and its samples' states."""

    def __init__(self, mode: str, token: str, max_bytes: int = MAX_RUN_BYTES):
        if mode not in MODES[1:]:
            raise ValueError(f"turn states mode {mode!r}")
        self.mode, self.token = mode, token
        self.budget = Budget(max_bytes)
        self.samples: dict[str, SampleStates] = {}
        self.unknown = 0  # announcements of sessions no sample registered (a canary, another run's)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.token_file: Path | None = None  # the run's token file (open_for_run), removed at close

    @property
    def hold_s(self) -> float:
        return HOLD_S if self.mode == "hold" else 0.0

    def start(self) -> str:
        """Listen on 127.0.0.1; the URL the gateway posts to (polar_announce)."""
        states = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                code, body = states._answer(self.path, self.headers, self.rfile)
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="turn-states", daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}{ANNOUNCE_PATH}"

    def _answer(self, path: str, headers, rfile) -> tuple[int, bytes]:
        given = headers.get(TOKEN_HEADER)
        if given is None:
            return 401, b'{"error": "no control token"}'
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return 403, b'{"error": "wrong control token"}'
        if path != ANNOUNCE_PATH:
            return 404, b'{"error": "not found"}'
        try:
            n = int(headers.get("content-length") or 0)
            doc = json.loads(rfile.read(min(n, MAX_BODY)))
            session, call_id = doc["session"], doc["call_id"]
            hold_s = float(doc.get("hold_s") or 0.0)
        except (ValueError, KeyError, TypeError):
            return 400, b'{"error": "expected {\\"session\\": str, \\"call_id\\": str}"}'
        with self._lock:
            sample = self.samples.get(session)
            if sample is None:
                self.unknown += 1
        if sample is None:  # a preflight's canary, or a call after its sample ended: nothing to snapshot
            return 202, b'{"skipped": "no sample of this run has that session"}'
        meta = sample.snapshot(str(call_id), hold_s, self.budget)
        return 200, json.dumps(meta).encode()

    def register(self, session: str, app: Path, directory: Path) -> SampleStates:
        """A sample about to start its agent: its working directory as it starts is the baseline."""
        directory.mkdir(parents=True, exist_ok=True)
        sample = SampleStates(session, app, directory, tree_stats(app))
        with self._lock:
            self.samples[session] = sample
        return sample

    def finish(self, session: str) -> None:
        """A sample has ended, scored or not: its snapshots go, and their bytes back to the run's budget."""
        with self._lock:
            sample = self.samples.pop(session, None)
        if sample is not None:
            shutil.rmtree(sample.directory, ignore_errors=True)
            self.budget.add(-sum(m.get("bytes", 0) for m in sample.calls.values()))

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.token_file is not None:
            self.token_file.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------------ scoring

def turn_scores(boundaries: list[str], sample: SampleStates, score, final_app: Path, parallel: int,
                start: Path | None, work: Path, owner: tuple[int, int] | None = None) -> dict | None:
    """{"calls": [{"call_id", "score"}...], "final": x} over the main-chain calls `boundaries`, or None when one has
    no snapshot or a score is missing. `score(state) -> float | None` runs the scorer on one working directory: an
    overlay view (`state_view`, and the final one stacked on the sample's, as the verifier's) where the sample's own
    was one, else a copy."""
    from polar.rollout import overlay

    snaps = [sample.calls.get(c, {}).get("path") for c in boundaries]
    if not boundaries or any(p is None for p in snaps):
        return None
    views = overlay.is_view(final_app) and start is not None and start.is_dir()
    dirs = []
    try:
        for i, snap in enumerate(snaps):
            target = work / f"turn-{i:04d}"
            _remove_state(target)
            if views:
                state_view(start, Path(snap), work, target.name, owner)
            else:
                materialize(start, Path(snap), target)
            dirs.append(target)
        final = work / "turn-final"
        _remove_state(final)
        if views:
            overlay.mount_view([final_app], work, final.name)
        else:
            shutil.copytree(final_app, final, symlinks=True)
        dirs.append(final)
        with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="progress") as pool:
            scores = list(pool.map(score, dirs))
    finally:
        for d in dirs:
            _remove_state(d)
    if any(s is None for s in scores):
        return None
    return {"calls": [{"call_id": c, "score": s} for c, s in zip(boundaries, scores[:-1])], "final": scores[-1]}


def _remove_state(state: Path) -> None:
    """A scored state gone: unmounted first when a view, its layers with it."""
    from polar.rollout import overlay

    if overlay.is_view(state):
        overlay.unmount(state)
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(state.parent / overlay.LAYERS / state.name, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------ the run's

# the run's (or a serve's, for all its runs) while it runs: samples run on its threads
_ACTIVE: TurnStates | None = None


def open_for_run(run_dir: Path, mode: str) -> tuple[TurnStates, list[str]]:
    """Start the run's announce endpoint; the --proxy-set items that tell the proxy of it. The token is the proxy's
    control token: a file the runner makes (0600) and names to the proxy (polar_control_token), so both hold it."""
    global _ACTIVE
    folder = run_dir / "turn-states"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    token_file = folder / "control-token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    token = secrets.token_hex(32)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    states = TurnStates(mode, token)
    states.token_file = token_file
    url = states.start()
    _ACTIVE = states
    return states, [f"polar_announce={url}", f"polar_announce_hold={states.hold_s:g}",
                    f"polar_control_token={token_file}"]


def close_for_run(states: TurnStates | None) -> None:
    """The endpoint `open_for_run` started, closed (None: a run that opened none — a serve's run, whose serve owns
    the endpoint every run shares — closes nothing)."""
    global _ACTIVE
    if states is None:
        return
    states.close()
    if _ACTIVE is states:
        _ACTIVE = None


def register(ctx: Any, job: Any, session: str, app: Path, work: Path) -> SampleStates | None:
    """A sample about to start: its states are taken from now on (None: --turn-states off, or the preflight's)."""
    if ctx.turn_states == "off" or job.canary or _ACTIVE is None:
        return None
    return _ACTIVE.register(session, app, work / "turn-states")


def finish(session: str) -> None:
    if _ACTIVE is not None:
        _ACTIVE.finish(session)


def score_sample(ctx: Any, job: Any, sample: SampleStates, records: list[dict], app: Path, start: Path | None,
                 work: Path) -> tuple[dict | None, dict]:
    """(turn_scores, sample.json's `turn_states`): the main-chain calls' states and the final one scored with the
    task's tests/progress.sh; turn_scores None without a scorer, or when any state is unscored."""
    from polar.processor.main_chain import main_chain_calls

    boundaries = main_chain_calls(records)
    detail = {"mode": ctx.turn_states, "boundaries": boundaries, "calls": sample.calls}
    scorer = Path(job.task.tests_dir) / PROGRESS
    if not scorer.is_file():
        detail["scorer"] = f"the task has no tests/{PROGRESS}"
        return None, detail
    from polar.rollout.sandbox import registry
    from polar.rollout.sandbox.view import owner

    scores = turn_scores(boundaries, sample, lambda state: run_progress(ctx, job, state, work), app,
                         max(1, ctx.parallel), start, work, owner(registry.get(ctx.sandbox)))
    return scores, detail


def run_progress(ctx: Any, job: Any, state: Path, work: Path) -> float | None:
    """tests/progress.sh on one working directory, in a sandbox like the verifier's (the tests copied in only now):
    its score in [0, 1], or None (it exited non-zero, timed out, or wrote no score in [0, 1])."""
    from polar.rollout import overlay
    from polar.rollout.sandbox import base as sb
    from polar.rollout.sandbox import registry
    from polar.rollout.sandbox.run import run_sandboxed
    from polar.rollout.specs import verifier_spec
    from polar.rollout.verify import read_reward

    home, logs = Path(f"{state}.home"), Path(f"{state}.logs")
    for d in (home, logs):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    try:
        if registry.get(ctx.sandbox).isolated:
            if os.geteuid() == 0:
                os.chown(logs, sb.UID, sb.GID)  # written by uid 1000 inside
            else:
                os.chmod(logs, 0o777)
        spec, argv, timeout = verifier_spec(ctx, job, state, home, logs, script=PROGRESS)
        if overlay.is_view(state):  # the sandbox uid's below its root already (state_view)
            spec = dataclasses.replace(spec, app_owned=True)
        out = Path(f"{state}.log")
        res = run_sandboxed(spec, argv, stdout=out, stderr=out.with_suffix(".err"), timeout=timeout)
        if res.timed_out or res.exit_code != 0:
            return None
        score, _, error = read_reward(logs)
        return score if error is None and score is not None and 0.0 <= score <= 1.0 else None
    finally:
        for d in (home, logs):
            shutil.rmtree(d, ignore_errors=True)
