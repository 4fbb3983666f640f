"""The end of a run: RUN/summary.json (statuses, rewards per task and whether their group has a spread, the
evaluation — resolved rate, its interval and pass@k, overall and per task (polar.records.estimators) — each task's
time limits, what processing made, whether the rewards are isolation-safe), its lines on stdout, and the exit
code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from polar.records import estimators
from polar.records.results import latest_by_sample
from polar.rollout.common import write_json
from polar.rollout.ledger import REWARDED, STATUSES
from polar.rollout.reporter import Reporter
from polar.rollout.sandbox import registry

NONE_WARNING = ("--sandbox none: the rewards are not isolation-safe (the agent ran on the host: it could read the "
                "tests and the solution and write anywhere)")


@dataclass(frozen=True)
class RunShape:
    """What the summary names the run by."""

    run_dir: Path
    run_id: str
    task_ids: list[str]
    samples: int
    agent: str
    sandbox: str
    no_process: bool
    time_limits: dict[str, dict] = field(default_factory=dict)  # task → {"agent_s", "verifier_s"}


def exit_code(cancelled: bool, processed: dict | None, rewarded: int) -> int:
    """130 cancelled; 1 processing failed, or no sample has a reward; else 0."""
    if cancelled:
        return 130
    if processed is not None and processed.get("exit") != 0:
        return 1
    return 0 if rewarded else 1


def summary_doc(shape: RunShape, lines: list[dict], processed: dict | None, cancelled: bool) -> dict:
    latest = latest_by_sample(lines)
    statuses: dict[str, int] = {}
    for ln in latest.values():
        statuses[ln["status"]] = statuses.get(ln["status"], 0) + 1
    rewarded = [ln for ln in latest.values() if ln["status"] in REWARDED and ln.get("reward") is not None]
    per_task = {}
    for tid in shape.task_ids:
        rs = [ln["reward"] for ln in rewarded if ln["task"] == tid]
        per_task[tid] = {"rewarded": len(rs), "mean_reward": sum(rs) / len(rs) if rs else None,
                         "spread": len(set(rs)) > 1}
    mean = sum(ln["reward"] for ln in rewarded) / len(rewarded) if rewarded else None
    ev = _evaluation(shape, latest.values())
    for tid, v in per_task.items():
        v.update({k: ev["per_task"][tid][k] for k in ("resolved", "resolved_rate", "pass_at", "unrewarded")},
                 time_limits=shape.time_limits.get(tid))
    doc = {"run_id": shape.run_id, "samples": len(shape.task_ids) * shape.samples, "finished": len(latest),
           "attempts": len(lines), "statuses": statuses, "rewarded": len(rewarded), "mean_reward": mean,
           "resolved_rate": ev["resolved_rate"], "resolved_ci95": ev["resolved_ci95"], "pass_at": ev["pass_at"],
           "unrewarded": ev["unrewarded"],
           "per_task": per_task, "sandbox": shape.sandbox, "isolation_safe": registry.get(shape.sandbox).isolated,
           "processed": processed, "exit_code": exit_code(cancelled, processed, len(rewarded)),
           "cancelled": cancelled}
    if not doc["isolation_safe"]:
        doc["warning"] = NONE_WARNING
    return doc


def _evaluation(shape: RunShape, latest) -> dict:
    """polar.records.estimators' block over each task's latest samples (None: a sample without a reward)."""
    outcomes: dict[str, list[bool | None]] = {tid: [] for tid in shape.task_ids}
    for ln in latest:
        if ln["task"] in outcomes:
            rewarded = ln["status"] in REWARDED and ln.get("reward") is not None
            outcomes[ln["task"]].append(estimators.is_resolved(ln["reward"], ln.get("reward_details"))
                                        if rewarded else None)
    return estimators.evaluation(outcomes, shape.samples)


def _resolved_line(doc: dict, samples: int) -> str:
    rate, ci, at = doc["resolved_rate"], doc["resolved_ci95"], doc["pass_at"]
    if rate is None:
        return f"  resolved  none counted ({doc['unrewarded']} sample(s) without a reward)"
    ks = sorted({1, samples})
    return (f"  resolved  rate {rate:.3f} (95% interval {ci[0]:.3f}–{ci[1]:.3f}, bootstrap over tasks), "
            + ", ".join(f"pass@{k} {at[str(k)]:.3f}" for k in ks if at.get(str(k)) is not None)
            + (f"; {doc['unrewarded']} sample(s) without a reward left out" if doc["unrewarded"] else ""))


def _processed_line(shape: RunShape, processed: dict | None) -> str:
    if processed is None:
        return "  processed skipped" + (" (--no-process)" if shape.no_process else "")
    if processed.get("exit") != 0:
        return f"  processed FAILED (polar-process exit {processed['exit']}; {shape.run_dir / 'process.log'})"
    if processed.get("report"):
        r = processed["report"]
        return (f"  processed {r['sequences']} sequence(s) from {r['calls']} call(s) of {r['sessions']} "
                f"session(s), {r['trainable_tokens']} trainable tokens, merge ratio "
                f"{r['merge_ratio'] or 0:.2f}, {r['batches']} batch file(s) → {processed['out']}")
    return ""


def summary_lines(shape: RunShape, doc: dict) -> list[str]:
    statuses, per_task, mean = doc["statuses"], doc["per_task"], doc["mean_reward"]
    out = [f"polar-rollout: run {doc['run_id']} — {len(shape.task_ids)} task(s) × K={shape.samples}, agent "
           f"{shape.agent}, sandbox {shape.sandbox}",
           f"  samples   {doc['finished']}/{doc['samples']} with a status, {doc['attempts']} attempt(s): "
           + ", ".join(f"{s} {statuses[s]}" for s in STATUSES if s in statuses),
           f"  rewards   {doc['rewarded']} rewarded, mean {mean:.3f}" if mean is not None else "  rewards   none"]
    out.append(_resolved_line(doc, shape.samples))
    groups = sum(1 for v in per_task.values() if v["spread"])
    out.append(f"  groups    {len(per_task)} ({groups} with a reward spread, i.e. non-zero advantages)")
    for tid, v in list(per_task.items())[:20]:
        m = f"{v['mean_reward']:.3f}" if v["mean_reward"] is not None else "-"
        out.append(f"    {tid:<32} rewarded {v['rewarded']}/{shape.samples}  mean {m}")
    if len(per_task) > 20:
        out.append(f"    … {len(per_task) - 20} more in {shape.run_dir / 'summary.json'}")
    processed = _processed_line(shape, doc["processed"])
    if processed:
        out.append(processed)
    out.append(f"  files     {shape.run_dir / 'results.jsonl'}, {shape.run_dir / 'rewards.jsonl'}")
    if "warning" in doc:
        out.append(f"  WARNING   {doc['warning']}")
    return out


def summarize(shape: RunShape, lines: list[dict], processed: dict | None, cancelled: bool, report: Reporter) -> int:
    """summary.json written, its lines printed; the run's exit code."""
    doc = summary_doc(shape, lines, processed, cancelled)
    write_json(shape.run_dir / "summary.json", doc)
    report.summary(summary_lines(shape, doc))
    return doc["exit_code"]
