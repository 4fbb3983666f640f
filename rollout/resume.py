"""--resume, and which attempts a run has left to do: the run's options from run.json (its identity must match), the
previous attempt cleaned up (its live proxy stopped, its containers removed, its writers' .open files closed, its
attempts without a line marked cancelled), and the plan — samples with no line, `cancelled` ones, `infra_error`
ones with retries left, each at an attempt past every one seen."""

from __future__ import annotations

import shutil
from pathlib import Path

from polar.launch import paths, runfiles
from polar.records.results import latest_by_sample
from polar.rollout.common import UsageError, group_of, session_of
from polar.rollout.flowwatch import flow_counter
from polar.rollout.job import SampleJob
from polar.rollout.ledger import ResultRow, Results
from polar.rollout.options import REUSED, Options
from polar.rollout.procs import close_dead_writers, is_our_proxy, stop_process_group
from polar.rollout.reporter import Reporter
from polar.rollout.sandbox import registry


def merge_resume(o: Options, prev: dict) -> None:
    """--resume: take the run's options from run.json (`prev`), unless given again; its run id must match."""
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


def check_identity(o: Options, tasks: list, prev: dict, run_dir: Path) -> None:
    diffs = []
    if [t.id for t in tasks] != prev.get("tasks"):
        diffs.append(f"tasks {prev.get('tasks')} → {[t.id for t in tasks]}")
    for k in ("agent", "samples", "sandbox"):
        if getattr(o, k) != prev.get(k):
            diffs.append(f"--{k} {prev.get(k)!r} → {getattr(o, k)!r}")
    if diffs:
        raise UsageError(f"--resume: the run in {run_dir} was started with other options ({'; '.join(diffs)})"
                         f"; resume with the same ones, or start a new run in another --out")


def _stop_previous(run_doc: dict, sandbox: str, run_dir: Path) -> list[str]:
    """Stop a live proxy of the previous attempt (a runner's own proxy ends with it; one may outlive it where prctl
    is not available), remove its containers, close dead writers' .open files."""
    notes = []
    prev = run_doc.get("proxy") or {}
    if prev.get("own") and is_our_proxy(prev.get("pid")):
        stop_process_group(prev["pid"])
        notes.append(f"stopped the previous attempt's proxy (pid {prev['pid']}, port {prev.get('port')})")
        if prev.get("run_dir"):
            runfiles.remove(paths.proxy_run_file(prev["run_dir"]))
    n = registry.get(sandbox).cleanup(run_doc["run_id"])
    if n:
        notes.append(f"removed {n} container(s) labelled polar-run={run_doc['run_id']}")
    closed = close_dead_writers(run_dir / "flows")
    if closed:
        notes.append(f"closed {len(closed)} flow file(s) of a dead writer")
    return notes


def _attempt_dirs(samples: Path):
    """(task, k, attempt, its directory) of every attempt directory under RUN/samples."""
    for task_dir in sorted(samples.iterdir()) if samples.is_dir() else []:
        for k_dir in sorted(task_dir.iterdir(), key=lambda p: p.name):
            for a_dir in sorted(k_dir.iterdir(), key=lambda p: p.name):
                if k_dir.name.isdigit() and a_dir.name.isdigit():
                    yield task_dir.name, int(k_dir.name), int(a_dir.name), a_dir


def _mark_unfinished(results: Results, run_doc: dict, run_dir: Path) -> list[str]:
    """An attempt directory without a result line was cut by the runner's death: a `cancelled` line for it."""
    notes = []
    have = {(ln.get("task"), ln.get("k"), ln.get("attempt")) for ln in results.read()}
    run_id = run_doc["run_id"]
    counter = flow_counter((run_doc.get("proxy") or {}).get("flows") or run_dir / "flows")
    for task, k, attempt, a_dir in _attempt_dirs(run_dir / "samples"):
        if (task, k, attempt) in have:
            continue
        t = a_dir.stat().st_mtime
        session = session_of(run_id, task, k, attempt)
        results.append(ResultRow(
            run_id=run_id, session=session, group=group_of(run_id, task), task=task, k=k, attempt=attempt,
            agent=run_doc.get("agent"), sandbox=run_doc.get("sandbox"), status="cancelled", t_start=t, t_end=t,
            calls=counter.counts(session).calls,
            error="the runner stopped before this attempt ended (found at --resume)"))
        notes.append(f"attempt {task}/{k}/{attempt} had no result line: marked cancelled")
    return notes


def clean_dead_attempt(run_dir: Path, run_doc: dict, sandbox: str, results: Results, report: Reporter) -> None:
    """--resume: clean up after the previous attempt of the run (see the module docstring) and forget its scratch
    directories; each thing done is one line on stderr."""
    notes = _stop_previous(run_doc, sandbox, run_dir)
    results.read()
    if results.torn:
        report.warn(results.torn)
    results.repair()
    notes += _mark_unfinished(results, run_doc, run_dir)
    shutil.rmtree(run_dir / ".work", ignore_errors=True)
    for note in notes:
        report.note(f"resume: {note}")


def plan(results: Results, tasks: list, samples: int, retry_infra: int, run_dir: Path,
         report: Reporter) -> tuple[list[SampleJob], int]:
    """(the attempts to run, the samples already done): samples with no line, `cancelled` ones, `infra_error` ones
    with retries left."""
    lines = results.read()
    if results.torn:
        report.warn(results.torn)
        results.repair()
    latest = latest_by_sample(lines)
    infra: dict[tuple[str, int], int] = {}
    next_attempt: dict[tuple[str, int], int] = {}
    for ln in lines:
        key = (ln.get("task"), ln.get("k"))
        next_attempt[key] = max(next_attempt.get(key, 0), (ln.get("attempt") or 0) + 1)
        if ln.get("status") == "infra_error":
            infra[key] = infra.get(key, 0) + 1
    jobs, done = [], 0
    for k in range(samples):
        for task in tasks:
            key = (task.id, k)
            line = latest.get(key)
            status = line.get("status") if line else None
            if line is None or status == "cancelled" or (status == "infra_error" and infra.get(key, 0) <= retry_infra):
                jobs.append(SampleJob(task, k, _next_attempt(run_dir, key, next_attempt.get(key, 0))))
            else:
                done += 1
    order = [t.id for t in tasks]
    jobs.sort(key=lambda j: (order.index(j.task.id), j.k))
    return jobs, done


def _next_attempt(run_dir: Path, key: tuple[str, int], after: int) -> int:
    """Past every attempt with a line and every attempt directory (a killed one may have left records)."""
    kdir = run_dir / "samples" / key[0] / str(key[1])
    seen = [int(p.name) + 1 for p in kdir.iterdir() if p.name.isdigit()] if kdir.is_dir() else []
    return max([after, *seen])
