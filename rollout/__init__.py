"""The rollout runner `polar-rollout`: Harbor tasks, sandboxes, verifiers, samples, results.

It imports polar.records, polar.launch and the processor's API — never the addon (the floors:
docs/architecture.md#the-floors) — and talks to the proxy only as an agent would.
"""
