"""What runs inside a sandbox as the agent: `pyagent` (a python:MODULE:FUNC agent run like a CLI, or a warm slot's
zygote) and `sdk_agent` (the demo's agent, one protocol per sample with an official SDK).

Import budget: these modules are bound into sandboxes on their own, without the rest of polar (rollout/specs.py's
AGENT_FILES), and run on an interpreter that may hold nothing but the standard library — so at module level they
import the standard library and, of polar, only polar.records.protocols (a standard-library leaf bound beside them).
An official SDK (anthropic, openai, google.genai) is imported inside the function that uses it. This file imports
nothing (tests/rollout/test_agents.py holds all three to it, on an interpreter without site-packages)."""
