"""The patch as a product: a sample's final.diff, its SWE-bench identity, RUN/predictions.jsonl, and what a reward
line carries into polar-process.

1. final.diff: when the start state is a git repository, the agent's change against the base commit as a git patch
   (polar.rollout.gitpatch: new untracked and binary files included, the agents' own directories left out, nothing
   the agent's .git names run here) — the task's tests/config.json `base_commit` when it has one, else the start
   state's HEAD. Otherwise, or when git cannot make the patch (the reason is kept in sample.json), the text diff of
   the tree (polar.rollout.treediff).
2. A task's SWE-bench identity is its tests/config.json (SWE-bench's record: `instance_id`, `base_commit`, …); a
   task without one is named by its id.
3. RUN/predictions.jsonl, SWE-bench's predictions file: one line per sample whose final.diff is a git patch
   (`instance_id`, `model_name_or_path`, `model_patch`), plus `k` and `session`: with K > 1 an instance has K lines,
   and SWE-bench's harness takes one prediction per instance (filter by `k`). The model's name is the one the
   backend served the run's calls as (the records' `model_served`, the most frequent), else --model, else "unknown".
4. A reward line of an SWE sample (its final.diff a git patch, or its reward.json saying `resolved`) carries
   `resolved` (reward.json's word, else reward 1) and, for a git patch, `patch`, so that polar-process's sft.jsonl
   rows hold them; other lines stay as they were.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable

from polar import records as rec
from polar.records.estimators import is_resolved
from polar.records.files import write_atomic
from polar.records.results import latest_by_sample
from polar.rollout.gitpatch import PatchError, git_dir, git_patch, start_head
from polar.rollout.treediff import tree_diff

GIT_KIND, TREE_KIND = "git", "tree"


def task_record(task_dir: Path) -> dict:
    """tests/config.json when it is a JSON object (SWE-bench's record), else {} (a task without one, or one we cannot
    read: the grader, which reads it too, says why)."""
    try:
        doc = json.loads((Path(task_dir) / "tests" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def instance_id(task_id: str, record: dict) -> str:
    value = record.get("instance_id")
    return value if isinstance(value, str) and value else task_id


def write_final_diff(path: Path, start: Path | None, app: Path, record: dict) -> dict:
    """final.diff (rule 1) written to `path`; sample.json's account of it: kind, base, and why git could not."""
    repo = git_dir(start)
    if repo is not None:
        base = record.get("base_commit") if isinstance(record.get("base_commit"), str) else None
        try:
            base = base or start_head(repo)
            path.write_bytes(git_patch(app, repo, base))
            return {"kind": GIT_KIND, "base": base}
        except PatchError as exc:
            path.write_text(tree_diff(start, app), encoding="utf-8")
            return {"kind": TREE_KIND, "git_error": str(exc)}
    path.write_text(tree_diff(start, app), encoding="utf-8")
    return {"kind": TREE_KIND}


def _sample_dir(run_dir: Path, line: dict) -> Path:
    return run_dir / "samples" / line["task"] / str(line["k"]) / str(line["attempt"])


def git_patch_of(run_dir: Path, line: dict) -> str | None:
    """A sample's final.diff when it is a git patch (its sample.json says so), else None."""
    sample_dir = _sample_dir(run_dir, line)
    try:
        detail = json.loads((sample_dir / "sample.json").read_text(encoding="utf-8"))
        if (detail.get("final_diff") or {}).get("kind") != GIT_KIND:
            return None
        return (sample_dir / "final.diff").read_bytes().decode("utf-8", errors="replace")
    except (OSError, ValueError, AttributeError):
        return None


def carried(run_dir: Path, line: dict) -> dict:
    """What a rewarded sample's reward line carries into polar-process (rule 4)."""
    patch, details = git_patch_of(run_dir, line), line.get("reward_details")
    if patch is None and not (isinstance(details, dict) and isinstance(details.get("resolved"), bool)):
        return {}
    out = {"resolved": is_resolved(float(line["reward"]), details)}
    if patch is not None:
        out["patch"] = patch
    return out


def prediction_lines(run_dir: Path, lines: Iterable[dict], records: dict[str, dict], model: str) -> list[dict]:
    """predictions.jsonl's lines (rule 3): the latest attempt of each sample with a git patch, in (task, k) order."""
    out = []
    for (task, k), line in sorted(latest_by_sample(lines).items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        patch = git_patch_of(run_dir, line)
        if patch is not None:
            out.append({"instance_id": instance_id(task, records.get(task, {})), "model_name_or_path": model,
                        "model_patch": patch, "k": k, "session": line["session"]})
    return out


def served_model(flows: str | list[str], run_id: str) -> str | None:
    """The name the backend served most of the run's calls as (its flow records' `model_served`), else None."""
    counts: Counter[str] = Counter()
    prefix = f"{run_id}/"
    for path in rec.expand_inputs(flows if isinstance(flows, list) else [flows]):
        try:
            for _, _, got in rec.skim_file(path, frozenset({"session", "model_served"})):
                session, model = got.get("session"), got.get("model_served")
                if isinstance(session, str) and session.startswith(prefix) and isinstance(model, str) and model:
                    counts[model] += 1
        except (OSError, rec.Undecodable):
            continue
    return counts.most_common(1)[0][0] if counts else None


def write_predictions(run_dir: Path, lines: Iterable[dict], records: dict[str, dict], model: str) -> int:
    """RUN/predictions.jsonl replaced whole (absent when no sample made a git patch); its number of lines."""
    rows = prediction_lines(run_dir, lines, records, model)
    path = run_dir / "predictions.jsonl"
    if rows:
        write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    elif path.exists():
        path.unlink()
    return len(rows)
