"""RUN/report.html of polar-train: the loop's curves, one chart per quantity of train.jsonl, drawn as inline SVG
by polar.processor.figures' line_chart, the one curve polar-process's report draws too (no script, no network: the
page opens from disk). Rewritten atomically after every step. Standard library and the figures only (no torch, no
polars)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from polar.processor.figures import line_chart
from polar.records.files import write_atomic

# (title, [(train.jsonl field, legend)]) — one chart each
CHARTS = (
    ("mean reward per step", [("reward_mean", "all samples"), ("reward_hi", "mean + std"),
                              ("reward_lo", "mean − std"), ("eval_reward", "held-out tasks (no update)")]),
    ("groups without a reward spread", [("groups_without_spread", "groups without spread"), ("groups", "groups")]),
    ("KL to the initial policy (k3, nats/token)", [("kl_initial", "KL(π‖π_initial)")]),
    ("policy entropy on trainable tokens (nats)", [("entropy", "mean token entropy")]),
    ("response length (trainable tokens per sequence)", [("response_len", "tokens")]),
    ("optimizer updates per step", [("updates", "updates")]),
    ("GRPO loss", [("loss", "loss")]),
    ("importance ratio π/π_old", [("ratio_mean", "mean"), ("ratio_max", "max")]),
    ("clipped / truncated share of tokens", [
        ("clip_share", "clipped"), ("clip_share_low", "clipped low (r < 1 − ε, A < 0)"),
        ("clip_share_high", "clipped high (r > 1 + ε_high, A > 0)"), ("tis_share", "truncated (TIS)")]),
    ("entropy bonus coefficient", [("entropy_coef", "entropy_coef")]),
    ("verify: median |logprob gap| (nats)", [("verify_median_abs_gap", "median |gap|")]),
    ("verify: share of tokens within tolerance", [("verify_share_within", "share within")]),
)


def _derived(ln: dict) -> dict:
    """The line with the reward band's edges (mean ± std) added."""
    mean, std = ln.get("reward_mean"), ln.get("reward_std")
    if isinstance(mean, (int, float)) and isinstance(std, (int, float)):
        ln = dict(ln, reward_hi=mean + std, reward_lo=mean - std)
    return ln


def _points(lines: list[dict], key: str) -> list[tuple[int, float]]:
    lines = [_derived(ln) for ln in lines]
    return [(ln["step"], float(ln[key])) for ln in lines
            if isinstance(ln.get(key), (int, float)) and not isinstance(ln.get(key), bool)]


def _group_chart(lines: list[dict]) -> str:
    """One series per task: a step's groups are `<run-id>-step-000N/<task>`, so the task is the name after the
    last slash."""
    per_task: dict[str, list[tuple[int, float]]] = {}
    for ln in lines:
        for group, value in (ln.get("reward_mean_per_group") or {}).items():
            if isinstance(value, (int, float)):
                per_task.setdefault(group.rsplit("/", 1)[-1], []).append((ln["step"], float(value)))
    return line_chart("mean reward per step, per task", sorted(per_task.items()))


def _table(lines: list[dict]) -> str:
    head = ("step", "weights", "samples", "reward", "spread", "no spread", "eval", "updates", "KL init", "entropy",
            "loss", "ratio mean", "ratio max", "clip low", "clip high", "entropy coef", "verify median", "trainable",
            "seconds")
    rows = []
    for ln in lines:
        secs = ", ".join(f"{k} {v:.1f}" for k, v in (ln.get("seconds") or {}).items() if v is not None)
        no_spread = (f"{ln['groups_without_spread']}/{ln.get('groups')}" if ln.get("groups_without_spread") is not None
                     else None)
        cells = (ln["step"], ln.get("weight_version") or "–", ln.get("samples"), ln.get("reward_mean"),
                 ln.get("reward_std"), no_spread, ln.get("eval_reward"), ln.get("updates"), ln.get("kl_initial"),
                 ln.get("entropy"), ln.get("loss"), ln.get("ratio_mean"), ln.get("ratio_max"),
                 ln.get("clip_share_low"), ln.get("clip_share_high"), ln.get("entropy_coef"),
                 ln.get("verify_median_abs_gap"),
                 ln.get("tokens_trainable"), secs)
        rows.append("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in cells) + "</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render(run: Path, lines: list[dict]) -> str:
    plan = {}
    if (run / "train.json").is_file():
        plan = json.loads((run / "train.json").read_text())
    charts = [line_chart(title, [(name, _points(lines, key)) for key, name in series])
              for title, series in CHARTS]
    charts.insert(1, _group_chart(lines))
    style = ("body{font:14px system-ui,sans-serif;margin:24px;color:#222}figure{display:inline-block;margin:8px;"
             "vertical-align:top}figcaption{font-weight:600;margin-bottom:4px}.legend{font-size:12px}"
             "table{border-collapse:collapse;margin-top:16px}td,th{border:1px solid #ccc;padding:3px 6px;"
             "font-size:12px;text-align:right}.none{color:#888}")
    title = f"polar-train — {run.name}"
    what = (f"{html.escape(str(plan.get('agent')))} on {len(plan.get('tasks') or [])} task path(s)"
            + (f" ({plan['tasks_per_step']} task(s) per step)" if plan.get("tasks_per_step") else "")
            + f", K={plan.get('samples')}, lr {plan.get('lr')} ({html.escape(str(plan.get('lr_source', 'given')))}), "
            f"{plan.get('mini_batches', 1)} mini-batch(es) × {plan.get('epochs', 1)} epoch(s), seed "
            f"{plan.get('seed', 0)}, clip {plan.get('clip')}"
            + (f"/{plan['clip_high']}" if plan.get("clip_high") is not None else "")
            + (f", entropy coef {plan.get('entropy_coef')}" if plan.get("entropy_coef") else "")
            + (f", entropy target {plan['entropy_target']}" if plan.get("entropy_target") is not None else "")
            + f", advantages {plan.get('advantage_norm', 'std')}, normalize {plan.get('normalize', 'token')}, "
            f"{plan.get('dtype')}; "
            f"{len(lines)} of {plan.get('steps')} step(s) done") if plan else f"{len(lines)} step(s)"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}"
            f"</style></head><body><h1>{html.escape(title)}</h1><p>{what}</p>{''.join(charts)}{_table(lines)}"
            "</body></html>\n")


def write_report(run: Path, lines: list[dict]) -> Path:
    path = run / "report.html"
    write_atomic(path, render(run, lines))
    return path
