"""The one rule for a test that needs something CI installs (scripts/setup: the sandboxes' system packages, the vLLM
and trainer venvs, the models, the agent CLIs, Chromium, root for mounts): `need(why_not, setup=...)`.

`why_not` is None (or empty) when the thing is there and works, else one line saying what is wrong. Then, under
CI=true (CI installs all of it, so its absence is a broken setup, not a reason to pass quietly), the test FAILS
with that reason; elsewhere it is skipped with the reason and the setup command that brings it. Standard library
and pytest only, so any test or support module can use it.

    need(sandbox.available("bwrap"), setup="scripts/setup --system")
    need(None if shutil.which("dockerd") else "dockerd is not installed", setup="scripts/setup --system")

tests/test_suite_honesty.py fails on a `pytest.skip` that names such a thing without going through here. The skip
raised here carries a mark (`not_installed`), so that tests/known-skips.txt's check (tests/support/known_skips.py)
can tell it from a skip that the list must name.
"""

from __future__ import annotations

import os

import pytest

SYSTEM = "scripts/setup --system"
VLLM = "scripts/setup --vllm --models"
CLIS = "scripts/setup --clis"
TRAIN = "scripts/setup --train"
IMAGES = "scripts/setup --images"
BASE = "scripts/setup"


def in_ci() -> bool:
    """CI=true, as .ci/run's machine sets it (tests/e2e also sets CI=1 for the CLIs it starts: not this)."""
    return os.environ.get("CI", "").lower() == "true"


def need(why_not: str | None, *, setup: str = SYSTEM) -> None:
    """Nothing when `why_not` is None or empty; else pytest.fail under CI=true, pytest.skip otherwise."""
    if not why_not:
        return
    if in_ci():
        pytest.fail(f"CI installs this ({setup}), but: {why_not}", pytrace=False)
    skip = pytest.skip.Exception(why_not if "scripts/setup" in why_not else f"{why_not} (run {setup})")
    skip.polar_not_installed = True
    raise skip


def not_installed(exc: BaseException) -> bool:
    """need()'s own skip off CI: something scripts/setup installs is missing here (under CI=true need() fails)."""
    return getattr(exc, "polar_not_installed", False) is True


def need_module(name: str, *, setup: str = BASE) -> None:
    """`need` for an importable module that the project's venv installs (an extra of .venv's install)."""
    import importlib.util

    need(None if importlib.util.find_spec(name) is not None else f"module {name!r} is not importable", setup=setup)


def need_sandbox(kind: str = "bwrap") -> None:
    """`need` for a rollout sandbox kind that starts here (polar.rollout.sandbox.registry.available: installed AND
    starts)."""
    from polar.rollout.sandbox import registry

    need(registry.available(kind), setup=SYSTEM)
