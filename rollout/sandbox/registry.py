"""The sandbox backends by name (--sandbox): each registered once. The built-in three are registered here; another
backend is one module whose Sandbox is handed to `register` (rollout/sandbox/base.py's protocol says what it fills),
and from then on --sandbox takes its name and every caller asks its facts."""

from __future__ import annotations

import os

from polar.rollout.sandbox import bwrap, docker, none
from polar.rollout.sandbox.base import SYSTEM_PYTHON, Sandbox, SandboxError

_BACKENDS: dict[str, Sandbox] = {}


def register(backend: Sandbox) -> Sandbox:
    """Make `backend` the one --sandbox `backend.kind` names (a second registration of a name is refused)."""
    if backend.kind in _BACKENDS and _BACKENDS[backend.kind] is not backend:
        raise ValueError(f"a sandbox backend named {backend.kind!r} is already registered")
    _BACKENDS[backend.kind] = backend
    return backend


def unregister(kind: str) -> None:
    _BACKENDS.pop(kind, None)


def kinds() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def names() -> str:
    """The registered names as a sentence's list: "bwrap, docker or none"."""
    kinds_ = list(_BACKENDS)
    return ", ".join(kinds_[:-1]) + f" or {kinds_[-1]}" if len(kinds_) > 1 else "".join(kinds_)


def get(kind: str) -> Sandbox:
    """The backend --sandbox `kind` names; SandboxError (one line naming the choices) for an unknown one."""
    try:
        return _BACKENDS[kind]
    except KeyError:
        raise SandboxError(f"unknown sandbox {kind!r} ({names()})") from None


def available(kind: str) -> str | None:
    """None if `kind` can run sandboxes here, else one line saying why not."""
    if kind not in _BACKENDS:
        return f"unknown sandbox {kind!r} ({names()})"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing (the sandbox wrapper runs on it): apt-get install python3"
    return _BACKENDS[kind].available()


for _backend in (bwrap.BACKEND, docker.BACKEND, none.BACKEND):
    register(_backend)
