"""The rollout stage of a polar-train step (docs/architecture.md#the-trainer-side): polar-rollout, in the proxy's
environment, runs the step's tasks (and, on evaluation steps, the held-out tasks at the same time); the trainer
reads back what it wrote — RUN/steps/000N/run.json (whether processing succeeded) and results.jsonl (the rewards).
The two environments meet only through files and commands."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

from polar.trainer.plan import Plan, StageFailed, task_dirs, tasks_of_step


def step_dir(run: Path, step: int) -> Path:
    return run / "steps" / f"{step:04d}"


def version_of(step: int) -> str:
    return f"step-{step:04d}"


def eval_dir(run: Path, step: int) -> Path:
    return run / "evals" / f"{step:04d}"


def rollout_cmd(plan: Plan, run: Path, step: int, url: str, out: Path, tasks: list[str], samples: int,
                run_id: str) -> list[str]:
    """polar-rollout's command line for one RUN (continued with --resume when it already exists)."""
    cmd = shlex.split(plan.rollout_cmd)
    if (out / "run.json").is_file():
        cmd += ["--resume", "--out", str(out)]
    else:
        cmd += [*tasks, "--agent", plan.agent, "--out", str(out), "--samples", str(samples),
                "--run-id", run_id, "--upstream", url,
                "--proxy-set", "polar_exact=true", "--proxy-set", f"polar_sampling_override={plan.sampling}",
                # the model's own tokenizer names its end-of-turn ids: a step whose completions all ran into
                # max_tokens (a random policy's) has no natural stop to take them from
                f"--process-opt=--tokenizer={plan.model}", *plan.rollout_opt]
    return cmd


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("HTTPS_PROXY", "https_proxy", "VIRTUAL_ENV")}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "a", encoding="utf-8")
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    finally:
        log.close()


def rollout(plan: Plan, run: Path, step: int, url: str, evaluate: bool = False) -> tuple[dict, float, dict | None]:
    """polar-rollout for the step's tasks (and, with `evaluate`, at the same time for the held-out tasks: no
    update follows from those); (its run.json, seconds, the evaluation's rewards or None)."""
    out = step_dir(run, step)
    t0 = time.monotonic()
    proc = _spawn(rollout_cmd(plan, run, step, url, out, tasks_of_step(plan, step), plan.samples,
                              f"{run.name}-{version_of(step)}"), run / "steps" / f"{step:04d}.log")
    ev = None
    if evaluate:
        ev_out = eval_dir(run, step)
        ev = _spawn(rollout_cmd(plan, run, step, url, ev_out, task_dirs(plan.eval_tasks), plan.eval_samples,
                                f"{run.name}-eval-{step:04d}") + ["--no-process"], run / "evals" / f"{step:04d}.log")
    try:
        code = proc.wait()
        seconds = time.monotonic() - t0
        ev_code = ev.wait() if ev is not None else None
    except BaseException:
        for pr in (proc, ev):
            if pr is not None and pr.poll() is None:
                pr.terminate()
        raise
    if code != 0 or not (out / "run.json").is_file():
        raise StageFailed(step, "rollout", f"polar-rollout exit {code} (log: {run}/steps/{step:04d}.log)")
    evaluation = None
    if ev is not None:
        if ev_code != 0 or not (eval_dir(run, step) / "results.jsonl").is_file():
            raise StageFailed(step, "evaluation", f"polar-rollout exit {ev_code} (log: {run}/evals/{step:04d}.log)")
        evaluation = rewards_of(eval_dir(run, step))
    doc = json.loads((out / "run.json").read_text())
    processed = doc.get("processed") or {}
    if processed.get("exit") != 0 or not (out / "out" / "batches").is_dir():
        raise StageFailed(step, "process", f"polar-process exit {processed.get('exit')} ({out}/process.log)")
    return doc, seconds, evaluation


def rewards_of(out: Path) -> dict:
    """The step's results.jsonl (latest attempts): samples, statuses, reward_mean, reward_std (over every rewarded
    sample), reward_mean_per_group, groups, groups_without_spread (fewer than 2 rewards, or all equal: every
    advantage of the group is 0)."""
    latest: dict = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        if line.strip():
            doc = json.loads(line)
            latest[(doc["task"], doc["k"])] = doc
    statuses: dict[str, int] = {}
    groups: dict[str, list[float]] = {}
    for doc in latest.values():
        statuses[doc["status"]] = statuses.get(doc["status"], 0) + 1
        if doc.get("reward") is not None:
            groups.setdefault(doc["group"], []).append(float(doc["reward"]))
    every = [r for rs in groups.values() for r in rs]
    per_group = {g: sum(rs) / len(rs) for g, rs in sorted(groups.items())}
    mean = sum(every) / len(every) if every else None
    std = (sum((r - mean) ** 2 for r in every) / len(every)) ** 0.5 if every else None
    flat = sum(1 for rs in groups.values() if len(rs) < 2 or max(rs) - min(rs) <= 1e-12)
    return {"samples": len(latest), "statuses": statuses, "reward_mean": mean, "reward_std": std,
            "reward_mean_per_group": per_group, "groups": len(groups), "groups_without_spread": flat}
