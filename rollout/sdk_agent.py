"""`--agent python:polar.rollout.sdk_agent:run` (and `:answer`, `:steps`) — the names users type (README, docs); the
agent itself is polar.rollout.agents.sdk_agent. Bound into the sandbox beside it."""

from polar.rollout.agents.sdk_agent import answer, run, steps  # noqa: F401 — the names --agent python:… reaches
