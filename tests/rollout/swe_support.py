"""What the SWE tests share: examples/swe's tasks, their records, a testbed at a task's base commit, and `swe_base` —
the one base image every SWE task builds on in the tests.

examples/swe/environment/Dockerfile installs git and pytest (pinned) unless its base already has those versions.
`swe_base` is the python stand-in with exactly that step run once, from the registries this machine reaches (the
Debian mirror, PyPI), as `scripts/setup` reaches them; the tasks' own builds then run with no network and fetch
nothing. It yields {"image", "map" (an --image-map file naming it for python:3.12-slim), "host"}. A test module
imports it; the modules that do each get the image from docker's build cache after the first."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SWE = ROOT / "examples" / "swe"
TASKS = tuple(sorted(p.parent.name for p in SWE.glob("*/task.toml")))


def record(task: str) -> dict:
    return json.loads((SWE / task / "tests" / "config.json").read_text())


def base_tree(task: str, dest: Path) -> Path:
    """The task's repository at base_commit, as the image's /testbed holds it (a clone of tests/base.bundle)."""
    subprocess.run(["git", "clone", "-q", str(SWE / task / "tests" / "base.bundle"), str(dest)], check=True)
    return dest


def apply_patch(tree: Path, patch: str) -> None:
    subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=tree, input=patch, text=True, check=True)


def failing(reward: dict) -> list[str]:
    """The tests reward.json says did not pass, sorted."""
    return sorted(t for t, s in reward["tests"].items() if s not in ("PASSED", "XFAIL"))


SWE_BASE = "polar-standin/swe-python:3.12-slim"
BUILD_TIMEOUT = 600


def install_step() -> str:
    """The Dockerfile's ARG and RUN lines between FROM and WORKDIR: the git and pytest install, verbatim."""
    text = (SWE / "environment" / "Dockerfile").read_text()
    step = re.search(r"^FROM [^\n]+\n(.*?)^WORKDIR ", text, re.M | re.S)
    assert step and "pytest==" in step.group(1), "examples/swe/environment/Dockerfile lost its install step"
    return step.group(1)


@pytest.fixture(scope="session")
def swe_base(images, tmp_path_factory):
    python = images["loaded"]["python:3.12-slim"]
    ctx = tmp_path_factory.mktemp("swe-base")
    (ctx / "Dockerfile").write_text(f"FROM {python}\n{install_step()}")
    env = {**os.environ, "DOCKER_HOST": images["host"]}
    proc = subprocess.run(["docker", "build", "-q", "--network", "host", "-t", SWE_BASE, str(ctx)], env=env,
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"the SWE base did not build: {proc.stderr[-2000:]}"
    map_file = ctx / "image-map.txt"
    map_file.write_text(f"python:3.12-slim={SWE_BASE}\n")
    return {"image": SWE_BASE, "map": map_file, "host": images["host"]}
