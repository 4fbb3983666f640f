"""The python: agent of the image-task tests (`--agent python:shellagent:run`, copied into each test task's agent/):
a tool loop with the official openai SDK through the proxy, one tool `bash` (as Pi names its shell), each command
run by the image's own `bash` in the working directory, until the model answers with text (at most 6 turns).
Driven by tests/rollout/cli_policy.py's scripted policy for "pi"."""

from __future__ import annotations

import json
import os
import subprocess

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command in the working directory and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def run(instruction: str, workdir: str, env: dict[str, str]) -> int:
    from openai import OpenAI

    client = OpenAI(api_key="sk-polar-dummy", max_retries=0)
    messages: list[dict] = [{"role": "user", "content": instruction}]
    for _ in range(6):
        reply = client.chat.completions.create(model=env.get("POLAR_MODEL", "gpt-4o-mini"), messages=messages,
                                               tools=TOOLS).choices[0].message
        calls = reply.tool_calls or []
        messages.append({"role": "assistant", "content": reply.content or "",
                         **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
        if not calls:
            print(reply.content)
            return 0
        for call in calls:
            command = json.loads(call.function.arguments or "{}").get("command", "")
            # the image's bash, the image's PATH: what a CLI agent's shell tool would run
            done = subprocess.run(["bash", "-c", command], cwd=workdir, capture_output=True, text=True, timeout=120)
            print(f"$ {command}\n{done.stdout}{done.stderr}[exit {done.returncode}]")
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": f"{done.stdout}{done.stderr}[exit {done.returncode}]"})
    return 3
