"""`polar-rollout serve`: one proxy and preflight for many runs (`server`), a served run's flow files (`runflows`),
and the files, messages and client polar-train uses (`protocol`, standard library only, importable from .venv-train:
which is why this file imports nothing)."""
