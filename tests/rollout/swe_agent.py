"""The SWE tests' agent (python:swe_agent:run, from the task's agent/ folder). It asks the model once (the runner
keeps only samples with a model call; the answer is not used), prints the HEAD of the repository it starts in (the
image's base commit) and, on sample 1, runs the task's solution/solve.sh (copied into agent/ by the test); sample 0
leaves the start state as it is."""

from __future__ import annotations

import os
import subprocess


def run(instruction: str, workdir: str, env: dict[str, str]) -> int:
    from openai import OpenAI

    OpenAI(api_key="sk-polar-dummy", max_retries=0).chat.completions.create(
        model=env.get("POLAR_MODEL", "gpt-4o-mini"), messages=[{"role": "user", "content": instruction}])
    head = subprocess.run(["git", "-c", "safe.directory=*", "rev-parse", "HEAD"], cwd=workdir, capture_output=True,
                          text=True)
    print(f"HEAD {head.stdout.strip()} in {workdir}{' ' + head.stderr.strip() if head.returncode else ''}", flush=True)
    if env.get("POLAR_SAMPLE") != "1":
        return 0
    solve = subprocess.run(["bash", os.path.join(env["POLAR_AGENT_DIR"], "solve.sh")], capture_output=True, text=True)
    print(solve.stdout + solve.stderr, flush=True)
    return solve.returncode
