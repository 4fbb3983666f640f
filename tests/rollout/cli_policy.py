"""A scripted policy for `polar-rollout` with the real agent CLIs: the scripted upstream's reply function, deciding
each reply from the conversation the CLI sent (stateless, so parallel samples can interleave freely).

Main conversation of a task (its instruction is in a user message):
  no tool result yet            → a call of the CLI's own shell tool running `echo polar-sample-$POLAR_SAMPLE`
  one tool result, sample 0 / 1 → a shell call that solves the task (the command is embedded here: the agent never
                                  sees solution/)
  one tool result, sample ≥ 2   → a shell call that does nothing useful (`ls`)
  two or more tool results      → a final text answer
The preflight's canary sample gets "ok"; every other request (side calls: Gemini's router, Claude's title call,
Qwen's memory extractor, …) gets the upstream's default reply.

Use: `monkeypatch.setattr(upstream, "_next_reply", CliPolicy("codex"), raising=False)`; `.seen` then holds, per
(task, sample), what each main turn did (for the tests' assertions).
"""

from __future__ import annotations

import json
import re
import threading

from tests.support.scripted_upstream import Reply

SAMPLE_COMMAND = "echo polar-sample-$POLAR_SAMPLE"
SAMPLE_RE = re.compile(r"polar-sample-(\d+)")
NOOP_COMMAND = "ls"
FINAL_TEXT = "I am done with the task."
CANARY_MARK = "connectivity check before a rollout"
SOLVES = frozenset({0, 1})

# Per task: a text only its instruction holds, and the shell command that solves it (from its solution/solve.sh).
TASKS = {
    "hello-file": ("hello.txt", "printf 'Hello, Polar!\\n' > hello.txt"),
    "release-checksums": ("SHA256SUMS",
                          "find release -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum > SHA256SUMS"),
    # examples/harbor (published layout: each runs in its own image)
    "log-report": ("report.txt", "awk '{print $9}' access.log | sort | uniq -c | awk '{print $2, $1}' | sort -n "
                                 "> report.txt"),
    "dir-tree": ("TREE.txt", "tree -a --noreport --charset ascii src > TREE.txt"),
    "image-greeting": ("greet.py", "echo 'import os, sys; print(os.environ[\"GREETING\"] + \", \" + sys.argv[1] + "
                                   "\"!\")' > /app/greet.py"),
}

# The shell tool of each CLI (the name the gateway shows in the chat body's `tools`), as tests/e2e calls it.
SHELL_TOOLS = {"codex": "exec", "gemini-cli": "run_shell_command", "qwen-code": "run_shell_command", "pi": "bash",
               "claude-code": "Bash"}


def shell_call(harness: str, command: str) -> tuple[str, dict]:
    name = SHELL_TOOLS[harness]
    if harness == "codex":  # the default model's code-mode `exec` freeform tool
        return name, {"input": f"const r = await tools.exec_command({{cmd: {json.dumps(command)}}}); text(r.output);"}
    if harness == "claude-code":
        return name, {"command": command, "description": "Run a shell command"}
    return name, {"command": command}


def _text(content) -> str:
    if isinstance(content, list):
        return "".join((p.get("text") or "") if isinstance(p, dict) else str(p) for p in content)
    return content if isinstance(content, str) else json.dumps(content)


def _tool_names(body: dict) -> set[str]:
    return {(t.get("function") or {}).get("name") for t in body.get("tools") or []}


class CliPolicy:
    def __init__(self, harness: str, solves: frozenset[int] = SOLVES, tasks: dict[str, tuple[str, str]] | None = None):
        self.harness = harness
        self.solves = solves
        self.tasks = TASKS if tasks is None else tasks  # task → (a text only its instruction holds, its solving command)
        self.lock = threading.Lock()
        self.seen: dict[str, list[str]] = {}  # task → its main turns' kinds (probe, solve:K, noop:K, final)
        self.canary = 0
        self.preflight = False  # whether the run under test has a preflight (its canary calls count here)
        self.side = 0
        self.upstream = None

    def bind(self, upstream) -> CliPolicy:
        self.upstream = upstream
        return self

    def task_of(self, body: dict) -> str | None:
        users = "\n".join(_text(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "user")
        if CANARY_MARK in users:
            return "preflight"
        hits = [task for task, (mark, _) in self.tasks.items() if mark in users]
        return hits[0] if len(hits) == 1 else None

    def decide(self, body: dict) -> tuple[str, Reply | None]:
        """(kind, reply); reply None: the upstream's default reply."""
        task = self.task_of(body)
        if body.get("response_format") or task is None:
            return "side", None
        if task == "preflight":
            return "canary", Reply(text="ok")
        if SHELL_TOOLS[self.harness] not in _tool_names(body):
            return "side", None
        results = [_text(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "tool"]
        if not results:
            return "probe", self._call(SAMPLE_COMMAND)
        if len(results) == 1:
            found = SAMPLE_RE.findall(results[0])
            if found and int(found[-1]) in self.solves:
                return f"solve:{found[-1]}", self._call(self.tasks[task][1])
            return f"noop:{found[-1] if found else '?'}", self._call(NOOP_COMMAND)
        return "final", Reply(text=FINAL_TEXT)

    def _call(self, command: str) -> Reply:
        # Reasoning first: with the reasoning parser on, a first-turn call without it streams as text (tests/e2e).
        return Reply(reasoning="I will run a shell command.", tool_calls=[shell_call(self.harness, command)])

    def __call__(self, body: dict, prompt_ids: list[int]) -> tuple[Reply, bool]:
        kind, reply = self.decide(body)
        with self.lock:
            if kind == "side":
                self.side += 1
            elif kind == "canary":
                self.canary += 1
            else:
                self.seen.setdefault(self.task_of(body), []).append(kind)
        if reply is None:
            return self.upstream._default_reply(body, prompt_ids), False
        return reply, True
