"""What one sample is given: the agent (`--agent`, parsed), the run's context (picklable: a Ray task gets it whole),
the job (task, k, attempt) and where its files go."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.rollout import clis as agentlib
from polar.rollout.common import PREFLIGHT, UsageError, session_of


@dataclass(frozen=True)
class AgentSpec:
    text: str
    kind: str  # "cli" or "python"
    harness: str | None = None
    provider: str | None = None
    target: str | None = None  # MODULE:FUNC

    @classmethod
    def parse(cls, text: str) -> "AgentSpec":
        if text.startswith("python:"):
            target = text[len("python:"):]
            module, sep, func = target.partition(":")
            if not sep or not re.fullmatch(r"[A-Za-z_][\w.]*", module or "") or \
                    not re.fullmatch(r"[A-Za-z_][\w.]*", func or ""):
                raise UsageError(f"--agent {text}: expected python:MODULE:FUNC (e.g. python:agent:run)")
            return cls(text, "python", target=target)
        try:
            harness, provider = agentlib.parse_agent(text)
        except ValueError as exc:
            raise UsageError(f"--agent: {exc}") from None
        return cls(text, "cli", harness=harness, provider=provider)


@dataclass
class SampleContext:
    """Everything a sample needs, picklable (a Ray task gets it whole)."""

    run_id: str
    run_dir: str
    agent: AgentSpec
    sandbox: str
    image: str
    model: str | None
    proxy_port: int
    ca_pem: str
    ca_bundle: str
    flows: str
    venv: str
    npm_dir: str
    agent_timeout: float | None
    verify_timeout: float | None
    warm: bool = False  # --warm-agents: the python: agent runs in a warm slot (rollout/sandbox/warm.py)
    connect: str = "proxy"  # --connect: proxy | base-url
    envs: dict[str, Any] | None = None  # task id → TaskEnv (rollout/images/environments.py); None: every task in the host view
    runtime: Any = None  # the sandbox runtime (rollout/images/runtime.py's Runtime) when a task runs in an image
    turn_states: str = "off"  # --turn-states: off | async | hold (rollout/turn_states.py)
    parallel: int = 1  # --parallel: also how many of one sample's turn states are scored at once
    reward_key: str = "reward"  # --reward-key: the key of reward.json a sample's reward is (rollout/verify.py)
    overlay: bool = False  # an image task's working directory is an overlay over its start state (rollout/overlay.py)


@dataclass
class SampleJob:
    task: Any  # tasks.Task
    k: int
    attempt: int
    canary: bool = False  # the preflight's one-turn sample: no verifier, no results line

    @property
    def key(self) -> tuple[str, int]:
        return (self.task.id, self.k)


def job_paths(ctx: SampleContext, job: SampleJob) -> tuple[str, Path, Path]:
    run = Path(ctx.run_dir)
    if job.canary:
        session = f"{ctx.run_id}/{PREFLIGHT}/1"
        return session, run / PREFLIGHT / "sample", run / ".work" / "preflight-1"
    session = session_of(ctx.run_id, job.task.id, job.k, job.attempt)
    return (session, run / "samples" / job.task.id / str(job.k) / str(job.attempt),
            run / ".work" / f"{job.task.id}-{job.k}-{job.attempt}")
