"""The rollout runner `polar-rollout`: Harbor tasks, sandboxes, verifiers, samples, results.

It imports the record reader and the processor's API, never the addon's internals, and talks to the proxy only as
an agent would.
"""
