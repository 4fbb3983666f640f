"""Helpers for the runner's tests: test tasks (Harbor layout) driven by tests/rollout/testagent.py, a polar-rollout
run as a subprocess, and RUN's files read back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLAR_ROLLOUT = [sys.executable, "-m", "polar.rollout.cli"]
AGENT = "python:testagent:run"

# Verifiers: `answer` scores answer.txt == 42 (reward.json with details), `crash` exits 1 without a reward, `hang`
# sleeps past its timeout, `txt` writes reward.txt.
VERIFIERS = {
    "answer": """
        if [ "$(cat "$APP/answer.txt" 2>/dev/null)" = 42 ]; then r=1.0; else r=0.0; fi
        printf '{"reward": %s, "answer": "%s"}\\n' "$r" "$(head -c 20 "$APP/answer.txt" 2>/dev/null)" > "$LOGS/reward.json"
    """,
    "txt": """
        if [ "$(cat "$APP/answer.txt" 2>/dev/null)" = 42 ]; then echo 1 > "$LOGS/reward.txt"; else echo 0 > "$LOGS/reward.txt"; fi
    """,
    "crash": """
        echo "the verifier crashed" >&2
        exit 1
    """,
    "hang": """
        sleep 60
    """,
}


def make_task(root: Path, name: str, mode: str, *, verifier: str = "answer", agent_timeout: float | None = None,
              verify_timeout: float | None = None, workdir: dict[str, str] | None = None) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "agent").mkdir()
    toml = ["[metadata]", 'author = "polar tests"']
    if agent_timeout:
        toml += ["[agent]", f"timeout_sec = {agent_timeout}"]
    if verify_timeout:
        toml += ["[verifier]", f"timeout_sec = {verify_timeout}"]
    (task / "task.toml").write_text("\n".join(toml) + "\n")
    (task / "instruction.md").write_text(f"mode: {mode}\nWrite the answer to six times seven in answer.txt.\n")
    body = textwrap.dedent(VERIFIERS[verifier])
    (task / "tests" / "test.sh").write_text(
        "#!/usr/bin/env bash\nAPP=${POLAR_APP:-/app}\nLOGS=${POLAR_LOGS:-/logs/verifier}\n" + body)
    files = {"README.md": "start state\n"} if workdir is None else workdir
    for rel, text in files.items():
        path = task / "environment" / "workdir" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    shutil.copyfile(HERE / "testagent.py", task / "agent" / "testagent.py")
    return task


def rollout_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HTTPS_PROXY", "https_proxy", "PYTEST_CURRENT_TEST")}
    env.update(extra)
    return env


def rollout(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*POLAR_ROLLOUT, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or rollout_env(), stdin=subprocess.DEVNULL)


def start_rollout(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*POLAR_ROLLOUT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or rollout_env(), stdin=subprocess.DEVNULL)


def results(run: Path) -> list[dict]:
    path = run / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def rewards(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rewards.jsonl").read_text().splitlines() if line.strip()]


def latest(lines: list[dict]) -> dict[tuple[str, int], dict]:
    out: dict[tuple[str, int], dict] = {}
    for line in lines:
        key = (line["task"], line["k"])
        if key not in out or line["attempt"] >= out[key]["attempt"]:
            out[key] = line
    return out


def explain(proc) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"
