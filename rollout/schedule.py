"""Scheduling the samples: on a thread pool (`--engine local`) or as Ray tasks on one node (`--engine ray`), at most
--parallel at once; every result row is written by this process (results.jsonl has one writer), and an
`infra_error` attempt with retries left runs again at once. Ctrl-C / SIGTERM set CANCEL, end every sandbox and
record the running attempts as `cancelled`."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable

from polar.launch import proxy as launch_proxy
from polar.rollout.common import CANCEL, UsageError
from polar.rollout.job import SampleContext, SampleJob
from polar.rollout.ledger import ResultRow, Results
from polar.rollout.procs import kill_children
from polar.rollout.progress import Progress
from polar.rollout.sample import failed_row, run_sample
from polar.rollout.sandbox import registry


@dataclass
class Plan:
    """What to run and how: the attempts, --parallel, --retry-infra, the engine (and Ray's address)."""

    jobs: list[SampleJob]
    parallel: int
    retry_infra: int = 0
    engine: str = "local"
    ray_address: str | None = None
    infra_count: dict[tuple[str, int], int] = field(default_factory=dict)
    slots: threading.Semaphore | None = None  # polar-rollout serve: sample slots shared by every run it serves


def execute(ctx: SampleContext, plan: Plan, results: Results, progress: Progress) -> bool:
    """Run the plan's attempts to their end; True when the run was cancelled."""
    if not plan.jobs:
        return False
    for ln in results.read():
        if ln.get("status") == "infra_error":
            key = (ln["task"], ln["k"])
            plan.infra_count[key] = plan.infra_count.get(key, 0) + 1

    def finished(job: SampleJob, row: ResultRow) -> SampleJob | None:
        results.append(row)
        progress.update(row)
        if row.status == "infra_error" and not CANCEL.is_set():
            plan.infra_count[job.key] = plan.infra_count.get(job.key, 0) + 1
            if plan.infra_count[job.key] <= plan.retry_infra:
                progress.done -= 1  # the sample is not done: it runs again
                return SampleJob(job.task, job.k, job.attempt + 1)
        return None

    pending, cancelled = list(plan.jobs), False
    old = _install_cancel_handlers()
    try:
        if plan.engine == "ray":
            _execute_ray(ctx, plan, pending, finished, progress, results)
        else:
            _execute_local(ctx, plan.parallel, pending, finished, progress, results, plan.slots)
    except KeyboardInterrupt:
        cancelled = True
    finally:
        _restore_handlers(old)
    return cancelled or CANCEL.is_set()


def _execute_local(ctx: SampleContext, parallel: int, pending: list[SampleJob],
                   finished: Callable[[SampleJob, ResultRow], SampleJob | None], progress: Progress,
                   results: Results, slots: threading.Semaphore | None = None) -> None:
    running: dict[Future, SampleJob] = {}
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="sample") as pool:
        try:
            while pending or running:
                while pending and len(running) < parallel and not CANCEL.is_set():
                    job = pending.pop(0)
                    running[pool.submit(_in_slot, slots, ctx, job)] = job
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
                running.pop(fut)
                try:
                    row = fut.result(timeout=60)
                except Exception:  # noqa: BLE001
                    continue
                results.append(row)
            raise


def _in_slot(slots: threading.Semaphore | None, ctx: SampleContext, job: SampleJob) -> ResultRow:
    """run_sample once one of the shared slots is free (at once without them); a cancel while it waits is the
    attempt's cancel."""
    if slots is None:
        return run_sample(ctx, job)
    while not slots.acquire(timeout=0.2):
        if CANCEL.is_set():
            return failed_row(ctx, job, "cancelled (Ctrl-C or SIGTERM)", status="cancelled")
    try:
        return run_sample(ctx, job)
    finally:
        slots.release()


def _ray_init(plan: Plan):
    try:
        import ray
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'polar-gateway[ray]'") from None
    init = {"address": plan.ray_address} if plan.ray_address else {
        "num_cpus": max(plan.parallel, os.cpu_count() or 1)}
    ray.init(**init, include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=False)
    return ray


def _execute_ray(ctx: SampleContext, plan: Plan, pending: list[SampleJob],
                 finished: Callable[[SampleJob, ResultRow], SampleJob | None], progress: Progress,
                 results: Results) -> None:
    ray = _ray_init(plan)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) > 1:
            raise UsageError(f"--engine ray: the cluster has {len(nodes)} nodes; this runner serves samples from "
                             f"one proxy on this node, so it runs on one node only")
        remote = ray.remote(num_cpus=1, max_retries=0)(_ray_sample)
        running: dict[Any, SampleJob] = {}
        try:
            while pending or running:
                while pending and len(running) < plan.parallel and not CANCEL.is_set():
                    job = pending.pop(0)
                    running[remote.remote(ctx, job)] = job
                if not running:
                    break
                progress.tick(len(running))
                done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                for ref in done:
                    job = running.pop(ref)
                    try:
                        row = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 — the worker died: infrastructure
                        row = failed_row(ctx, job, f"ray task failed: {exc}")
                    again = finished(job, row)
                    if again is not None:
                        pending.insert(0, again)
        except KeyboardInterrupt:
            CANCEL.set()
            for ref, job in running.items():
                ray.cancel(ref, force=True)
                results.append(failed_row(ctx, job, "cancelled (Ctrl-C or SIGTERM)", status="cancelled"))
            _cancel_sandboxes(ctx)
            raise
    finally:
        ray.shutdown()


def _ray_sample(ctx: SampleContext, job: SampleJob) -> ResultRow:
    return run_sample(ctx, job)


def _cancel_sandboxes(ctx: SampleContext) -> None:
    kill_children(spare=launch_proxy.started_pids())
    registry.get(ctx.sandbox).cleanup(ctx.run_id)  # what outlives its process group (docker's containers)


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
