"""The provider protocols a flow record names (`protocol`), in one place. Standard library only, importing nothing:
besides polar.records.schema, the SDK agent reads it inside a sandbox, where it is bound on its own next to the
agents (rollout/specs.py's AGENT_FILES) and nothing else of polar is importable."""

PROTOCOLS = ("anthropic_messages", "openai_chat", "openai_responses", "google_generate")
