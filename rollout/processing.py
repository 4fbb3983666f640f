"""polar-process over the run's flows, this run's task sessions only (one --session-prefix per task: the preflight's
sessions are left out), into RUN/out; its command and output in RUN/process.log; what polar-train reads back."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from polar.rollout.reporter import Reporter


def _report(out: Path) -> dict | None:
    """The counts polar-train and the summary read from RUN/out/report.json (through the processor's one reader)."""
    from polar.processor.report_doc import read_report

    with contextlib.suppress(OSError, ValueError):  # ReportError is a ValueError
        report = read_report(out / "report.json")
        return {"sequences": report.counts.sequences, "calls": report.counts.calls,
                "sessions": report.counts.sessions, "sessions_other_prefix": report.counts.sessions_other_prefix,
                "trainable_tokens": report.tokens.trainable, "merge_ratio": report.merge_ratio,
                "batches": report.outputs["batches"], "sft_lines": report.outputs["sft_lines"],
                "rewards": dataclasses.asdict(report.rewards)}
    return None


def served_vocab(upstream: str | None, timeout: float = 3.0) -> list[str]:
    """`--vocab MODEL=DIR` for each model the backend serves from a directory on this machine that holds a
    tokenizer.json (its `/v1/models` entry's `root`: vLLM's model path) — so report.html shows token text without
    being asked. Nothing for a remote backend, a replica list in a file, or a backend that does not answer."""
    out: list[str] = []
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through HTTPS_PROXY
    for url in (upstream or "").split(","):
        url = url.strip()
        if not url or url.startswith("@"):
            continue
        with contextlib.suppress(OSError, ValueError):
            with opener.open(url.rstrip("/") + "/models", timeout=timeout) as resp:
                entries = json.loads(resp.read()).get("data") or []
            for entry in entries:
                root = str(entry.get("root") or "")
                has = root.endswith("tokenizer.json") and os.path.isfile(root) or \
                    os.path.isfile(os.path.join(root, "tokenizer.json"))
                spec = f"{entry.get('id')}={root}" if entry.get("id") else root
                if root and has and spec not in out:
                    out.append(spec)
    return out


def run_processor(run_dir: Path, flows: str | list[str], run_id: str, task_ids: list[str], sft_min_reward: float | None,
                  process_opt: list[str], report: Reporter, upstream: str | None = None) -> dict:
    """polar-process over `flows` (a flow directory, or flow files), run to its end: {exit, seconds, out,
    command[, report]}. The served model's tokenizer is the report's vocabulary when `upstream` names it (a
    --process-opt=--vocab=… wins)."""
    out = run_dir / "out"
    inputs = [flows] if isinstance(flows, str) else list(flows)
    cmd = [sys.executable, "-m", "polar.processor.cli", *inputs, "-o", str(out), "--overwrite", "--rewards",
           str(run_dir / "rewards.jsonl"), "--no-progress"]
    for tid in task_ids:
        cmd += ["--session-prefix", f"{run_id}/{tid}/"]
    if sft_min_reward is not None:
        cmd += ["--sft-min-reward", repr(sft_min_reward)]
    cmd += list(process_opt)  # e.g. --process-opt=--engine=ray: the processor's engine is its own choice
    if not any(opt.startswith("--vocab") for opt in process_opt):
        cmd += [f"--vocab={spec}" for spec in served_vocab(upstream)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    (run_dir / "process.log").write_text(f"$ {shlex.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    for line in proc.stderr.splitlines():
        if line.strip():
            report.line(line)
    doc = {"exit": proc.returncode, "seconds": round(time.monotonic() - t0, 2), "out": str(out), "command": cmd}
    if proc.returncode == 0:
        report = _report(out)
        if report is not None:
            doc["report"] = report
    return doc
