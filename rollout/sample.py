"""One attempt of one sample, start to end: a fresh copy of the start state, the agent in its sandbox, the counts of
its calls once the proxy has recorded them, final.diff, the verifier, teardown — and its result row (the status
table in rollout/ledger.py). `run_sample` never raises: whatever happens becomes the row."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from polar.rollout import flowwatch, overlay, turn_states
from polar.rollout.common import CANCEL, Cancelled, group_of, now, write_json
from polar.rollout.job import SampleContext, SampleJob, job_paths
from polar.rollout.ledger import ResultRow
from polar.rollout.sandbox import registry, view
from polar.rollout.sandbox.base import SandboxError
from polar.rollout.sandbox.run import run_sandboxed
from polar.rollout.specs import agent_spec, task_env
from polar.rollout.proxyctl import probe_ready
from polar.rollout.patches import task_record, write_final_diff
from polar.rollout.verify import run_verifier

DEFAULT_AGENT_TIMEOUT = 600.0
CANARY_TIMEOUT = 180.0
CANARY_INSTRUCTION = ("This is a connectivity check before a rollout. Do not use any tool; reply with the single "
                      "word: ok")


def _copy_tree(src: Path | None, dst: Path) -> None:
    if src is not None and src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        dst.mkdir(parents=True)


def start_state(ctx: SampleContext, job: SampleJob) -> Path | None:
    """The directory a sample's working directory starts as a copy of: environment/workdir/ in the host view (or
    with --image), the image's WORKDIR files in an image (rollout/images/environments.py); None: empty."""
    if job.canary:
        return None
    tenv = task_env(ctx, job)
    if tenv is not None and tenv.image_mode and tenv.template is not None:
        return Path(tenv.template)
    return job.task.workdir


def _fresh_dirs(ctx: SampleContext, job: SampleJob, work: Path) -> tuple[Path, Path]:
    """(app, home) of a new attempt: a fresh view of the start state — an overlay over an image's WORKDIR files
    when the run can mount one (rollout/overlay.py), else a copy — and a HOME holding the proxy's CA files."""
    if work.exists():
        overlay.remove_work(work)
    app, home = work / "app", work / "home"
    start = start_state(ctx, job)
    tenv = None if job.canary else task_env(ctx, job)
    if ctx.overlay and start is not None and tenv is not None and tenv.image_mode and start.is_dir():
        overlay.own_tree(start, view.owner(registry.get(ctx.sandbox)))  # the image's export, never the task's files
        overlay.mount_view([start], work)
    else:
        _copy_tree(start, app)
    (home / ".polar").mkdir(parents=True)
    shutil.copyfile(ctx.ca_pem, home / ".polar" / "ca.pem")
    shutil.copyfile(ctx.ca_bundle, home / ".polar" / "ca-bundle.pem")
    return app, home


def _writable_root(ctx: SampleContext, spec, work: Path):
    """(spec, how) with the image's root writable for the agent through a layer of the sample's own, discarded after
    it: docker's container layer (`container`), bwrap's overlay view of the export (`overlay`), or, where the run
    cannot mount one, read-only as before (`read-only`, said once per run). None: not an image. The verifier's root
    is the image again: only the working directory carries over."""
    if not spec.image_mode:
        return spec, None
    backend = registry.get(ctx.sandbox)
    if not backend.exports_rootfs:
        return dataclasses.replace(spec, root_writable=True), "container"
    if not ctx.overlay or spec.rootfs is None:
        return spec, "read-only"
    root = overlay.rootfs_view(Path(spec.rootfs), work, view.owner(backend))
    return dataclasses.replace(spec, rootfs=root, root_writable=True), "overlay"


def _agent_timeout(ctx: SampleContext, job: SampleJob) -> float:
    if job.canary:
        return min(CANARY_TIMEOUT, ctx.agent_timeout or CANARY_TIMEOUT)
    return ctx.agent_timeout or job.task.agent_timeout_sec or DEFAULT_AGENT_TIMEOUT


class _Attempt:
    """The draft of one attempt's row (a dict until it ends), its sample.json detail and its phase clock."""

    def __init__(self, ctx: SampleContext, job: SampleJob):
        self.ctx, self.job = ctx, job
        self.session, self.sample_dir, self.work = job_paths(ctx, job)
        self.result: dict[str, Any] = {
            **ResultRow(run_id=ctx.run_id, session=self.session, group=group_of(ctx.run_id, job.task.id),
                        task=job.task.id, k=job.k, attempt=job.attempt, agent=ctx.agent.text,
                        sandbox=ctx.sandbox, t_start=now()).to_json()}
        self.detail: dict[str, Any] = {"paths": {"sample": str(self.sample_dir), "work": str(self.work)}}
        self.counter = flowwatch.flow_counter(ctx.flows)
        self.states: turn_states.SampleStates | None = None  # --turn-states: its snapshots at calls
        self._phase_t = time.monotonic()

    def lap(self, name: str) -> None:
        t = time.monotonic()
        timings = self.result["timings"]
        timings[name] = round(timings[name] + t - self._phase_t, 3)
        self._phase_t = t

    def fail(self, status: str, error: str) -> None:
        self.result.update(status=status, reward=None, error=error)

    def run(self) -> None:
        """Setup, the agent, its counts, final.diff, then the verifier when the status asks for one."""
        ctx, job, result = self.ctx, self.job, self.result
        self.sample_dir.mkdir(parents=True, exist_ok=True)
        tenv = None if job.canary else task_env(ctx, job)
        if tenv is not None:
            self.detail["environment"] = tenv.describe()
            if tenv.error:  # the environment phase failed for this task: nothing to run the agent in
                self.fail("infra_error", f"environment: {tenv.error}")
                return
        _check_cancel()
        app, home = _fresh_dirs(ctx, job, self.work)
        self.detail["workdir_view"] = "overlay" if overlay.is_view(app) else "copy"
        self.states = turn_states.register(ctx, job, self.session, app, self.work)
        spec, (argv, env, mounts, _) = agent_spec(ctx, job, self.session, app, home,
                                                  CANARY_INSTRUCTION if job.canary else job.task.instruction)
        if self.detail["workdir_view"] == "overlay":  # over a start state handed over once: only its root to own
            spec = dataclasses.replace(spec, app_owned=True)
        spec, root_view = _writable_root(ctx, spec, self.work)
        if root_view is not None:
            self.detail["root_view"] = root_view
        timeout = _agent_timeout(ctx, job)
        self.detail["agent"] = {"argv": argv, "env": _shown_env(env),
                                "mounts": [[str(m.host), m.inside, m.writable] for m in mounts], "timeout_s": timeout}
        self.lap("setup")
        _check_cancel()
        run = run_sandboxed
        if ctx.warm and not job.canary and not spec.image_mode:
            from polar.rollout.sandbox.warm import run_warm as run
            self.detail["agent"]["warm"] = True
        try:
            res = run(spec, argv, stdout=self.sample_dir / "agent.stdout", stderr=self.sample_dir / "agent.stderr",
                      timeout=timeout)
        finally:
            self.lap("agent")
        _check_cancel()
        self.detail["agent"].update(exit_code=res.exit_code, timed_out=res.timed_out, wall_s=round(res.wall_s, 3),
                                    memory_limit=res.memory_limit, proxy_connections=res.proxy_connections)
        result["agent_exit"] = res.exit_code
        counts = self._settled_counts(res.proxy_connections)
        self.lap("agent")  # the wait for the records of the calls it was in belongs to the agent's time
        result["calls"], result["trainable_tokens"] = counts.calls, counts.tokens
        self.detail["calls_with_token_ids"] = counts.with_ids
        if not job.canary:  # a git patch against the base commit when the start state is a repository
            self.detail["final_diff"] = write_final_diff(self.sample_dir / "final.diff", start_state(ctx, job), app,
                                                         task_record(job.task.path))
        _agent_status(ctx, result, res, counts.calls, counts.with_ids, timeout)
        if result["status"] in ("completed", "agent_error") and not job.canary:
            run_verifier(ctx, job, result, self.detail, self.sample_dir, self.work, app, self.lap)
        if self.states is not None and result["reward"] is not None:
            self._turn_scores(app)

    def _turn_scores(self, app: Path) -> None:
        """--turn-states: the main-chain calls' states and the final one, scored (rollout/turn_states.py)."""
        records = self.counter.records(self.session, since=self.result["t_start"] - 1.0)
        self.result["turn_scores"], self.detail["turn_states"] = turn_states.score_sample(
            self.ctx, self.job, self.states, records, app, start_state(self.ctx, self.job), self.work)
        self.lap("verify")

    def _settled_counts(self, connections: int) -> flowwatch.Counts:
        """The session's counts once the proxy has written every call's record (a call the agent was still in
        when it was killed ends as a client_abort record shortly after): never raced. An agent whose every
        connection failed its TLS handshake (the proxy counts them per session) has no call to wait for."""
        got = self.counter.counts(self.session)
        if got.with_ids == 0 and got.calls == 0 and connections:
            info = probe_ready(self.ctx.proxy_port, timeout=2.0) or {}
            if (info.get("tls_failures") or {}).get(self.session):
                return got
        return flowwatch.settled_counts(self.counter, self.session, connections=connections, stop=CANCEL.is_set)

    def cancelled(self) -> None:
        self.fail("cancelled", "cancelled (Ctrl-C or SIGTERM)")
        with contextlib.suppress(Exception):  # what the attempt did before it was cut (its records stay)
            counts = self.counter.counts(self.session)
            self.result["calls"], self.result["trainable_tokens"] = counts.calls, counts.tokens

    def end(self) -> ResultRow:
        if CANCEL.is_set() and self.result["status"] in (None, "infra_error"):  # a sandbox killed by the cancel
            self.fail("cancelled", "cancelled (Ctrl-C or SIGTERM)")
        turn_states.finish(self.session)  # its snapshots go, scored or not
        overlay.remove_work(self.work)
        self.lap("teardown")
        self.result["t_end"] = now()
        with contextlib.suppress(OSError):
            write_json(self.sample_dir / "sample.json", {**self.result, **self.detail})
        return ResultRow.from_json(self.result)


def _check_cancel() -> None:
    if CANCEL.is_set():
        raise Cancelled()


def run_sample(ctx: SampleContext, job: SampleJob) -> ResultRow:
    """One attempt of one sample, start to end: setup, agent, verifier, teardown. Never raises: the result row."""
    attempt = _Attempt(ctx, job)
    try:
        attempt.run()
    except Cancelled:
        attempt.cancelled()
    except SandboxError as exc:
        attempt.fail("infra_error", f"sandbox: {exc}")
    except Exception as exc:  # noqa: BLE001 — a runner bug must not take the run down: infra, with the traceback
        attempt.fail("infra_error", f"runner: {type(exc).__name__}: {exc}")
        attempt.detail["traceback"] = traceback.format_exc()
    return attempt.end()


def _agent_status(ctx: SampleContext, result: dict, res, calls: int, with_ids: int, agent_timeout: float) -> None:
    """The status the agent's run gives (the table in rollout/ledger.py), before any verifier."""
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


def _shown_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("<dummy key>" if k.endswith("_API_KEY") else v) for k, v in sorted(env.items())}


def _proxy_hint(ctx: SampleContext) -> str:
    info = probe_ready(ctx.proxy_port, timeout=2.0)
    if info is None:
        return f"; the proxy on port {ctx.proxy_port} does not answer its readiness probe"
    return ""


def failed_row(ctx: SampleContext, job: SampleJob, error: str, status: str = "infra_error") -> ResultRow:
    """The row of an attempt that never ran (its Ray task died, or it was cancelled before it reported)."""
    session, _, _ = job_paths(ctx, job)
    t = now()
    return ResultRow(run_id=ctx.run_id, session=session, group=group_of(ctx.run_id, job.task.id), task=job.task.id,
                     k=job.k, attempt=job.attempt, agent=ctx.agent.text, sandbox=ctx.sandbox, status=status,
                     t_start=t, t_end=t, error=error)
