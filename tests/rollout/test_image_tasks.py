"""Harbor tasks as published (examples/harbor: a Dockerfile FROM a digest-pinned python:3.12-slim that pip-installs
pytest, a Dockerfile that apt-installs `tree` — which this host does not have —, a `docker_image` task), run in their
own images through the real runner: rollout/images/environments.py, rollout/images/runtime.py, the image sandboxes.

The bases are the stand-ins `scripts/setup --images` builds (rollout/images/standins.py), mapped with --image-map @FILE;
the private dockerd (tests/rollout/conftest.py) is fresh each session, so every image is built here. Builds reach the
package registries this machine reaches (`--build-network host`), as `scripts/setup` does; nothing else leaves it.

1.x  the environment phase: both Dockerfiles built, a second run builds nothing (same image ids), a changed file in
     environment/ builds that task again; a failing build, a build past build_timeout_sec and a base that is not
     there are the task's error with the reason, never a reward
2.x  rollouts, K = 2 (the scripted policy solves sample 0 and leaves sample 1 at the start state): every task scores
     1.0 and 0.0, through --sandbox docker and bwrap, with the python shell agent and with Pi; run.json and each
     sample.json record the image ids and the substituted bases; a verifier that needs the network is
     verifier_error (docker run)
3.x  --resume refuses a run whose images changed
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from polar.rollout.images import environments as envlib
from polar.rollout.images.refs import parse_image_map
from polar.rollout.tasks import load_tasks
from tests.e2e.conftest import require_cli
from tests.rollout.cli_policy import CliPolicy
from tests.rollout.rollout_support import HERE, explain, latest, results, rollout, rollout_env
from tests.support.need import need_sandbox

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "harbor"
TASKS = ("dir-tree", "image-greeting", "log-report")
PYTHON_STANDIN = "polar-standin/python:3.12-slim"
TIMEOUT = 400


def harbor_copy(root: Path, *, agent: bool = True) -> Path:
    """examples/harbor copied, each task with our python shell agent in agent/ (the one extension the tests add)."""
    dest = root / "harbor"
    shutil.copytree(EXAMPLES, dest, ignore=shutil.ignore_patterns("README.md"))
    for name in TASKS:
        if agent:
            (dest / name / "agent").mkdir()
            shutil.copyfile(HERE / "shellagent.py", dest / name / "agent" / "shellagent.py")
    return dest


def phase(tasks_dir: Path, images, tmp: Path, **kw) -> dict:
    opts = envlib.PhaseOptions(image=kw.get("image"), image_map=parse_image_map([f"@{images['map']}"]),
                               build_network=kw.get("network", "host"), sandbox=kw.get("sandbox", "docker"),
                               builds_dir=tmp / "builds")
    return envlib.prepare(load_tasks([tasks_dir]), opts, log=lambda line: None)


# ---------------------------------------------------------------------------------------------------------------------
# 1.x the environment phase


def test_1_1_builds_once_and_again_when_environment_changes(images, cache_dir, tmp_path):
    tasks = harbor_copy(tmp_path)
    first = phase(tasks, images, tmp_path)
    assert {t: e.error for t, e in first.items()} == dict.fromkeys(TASKS), first
    assert first["log-report"].built and first["dir-tree"].built and not first["image-greeting"].built
    assert first["image-greeting"].image == PYTHON_STANDIN and first["image-greeting"].substitutions == (
        ("python:3.12-slim", PYTHON_STANDIN),)
    pin = "python:3.12-slim@sha256:57164dc5146b574fd6e0218705bb8d3bdb0896e3729660bf47cc8ed70d2ca5d7"
    assert first["log-report"].substitutions == ((pin, PYTHON_STANDIN),)
    assert first["dir-tree"].substitutions == (("debian:bookworm-slim", "polar-standin/debian:bookworm-slim"),)
    assert first["dir-tree"].workdir == "/srv/project" and first["log-report"].workdir == "/app"
    assert sorted(os.listdir(first["log-report"].template)) == ["access.log"]
    assert (tmp_path / "builds" / "log-report.log").is_file()
    again = phase(tasks, images, tmp_path)
    assert not any(e.built for e in again.values())
    assert {t: e.image_id for t, e in again.items()} == {t: e.image_id for t, e in first.items()}
    (tasks / "dir-tree" / "environment" / "project" / "docs" / "README.md").write_text("# Changed\n")
    changed = phase(tasks, images, tmp_path)
    assert changed["dir-tree"].built and changed["dir-tree"].image_id != first["dir-tree"].image_id
    assert changed["dir-tree"].key != first["dir-tree"].key
    assert not changed["log-report"].built and changed["log-report"].image_id == first["log-report"].image_id


def _task(root: Path, name: str, dockerfile: str, toml: str = "") -> None:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "task.toml").write_text(toml)
    (task / "instruction.md").write_text("Nothing.\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")


def test_1_2_a_failed_or_slow_build_and_a_missing_base_are_the_tasks_error(images, cache_dir, tmp_path):
    tasks = tmp_path / "tasks"
    _task(tasks, "broken", "FROM debian:bookworm-slim\nRUN echo polar-build-broke >&2; exit 3\n")
    _task(tasks, "slow", "FROM debian:bookworm-slim\nRUN sleep 60\n", "[environment]\nbuild_timeout_sec = 3\n")
    _task(tasks, "unknown-base", "FROM alpine:3.20\nRUN true\n")
    envs = phase(tasks, images, tmp_path, network="none")
    assert "failed (exit" in envs["broken"].error and "polar-build-broke" in envs["broken"].error
    assert "did not finish within 3 s (build_timeout_sec)" in envs["slow"].error
    assert "alpine:3.20 is not in the local docker daemon" in envs["unknown-base"].error
    assert "--image-map" in envs["unknown-base"].error
    for env in envs.values():
        assert "\n" not in env.error and env.image_id is None


# ---------------------------------------------------------------------------------------------------------------------
# 2.x rollouts


def _rollout(tmp_path, upstream, monkeypatch, images, *, agent: str, box: str, tasks: Path, run_id: str,
             harness: str = "pi"):
    if box == "bwrap":
        need_sandbox("bwrap")
    policy = CliPolicy(harness, solves=frozenset({0})).bind(upstream)
    monkeypatch.setattr(upstream, "_next_reply", policy, raising=False)
    run = tmp_path / "run"
    proc = rollout(str(tasks), "--agent", agent, "--out", str(run), "--sandbox", box, "--upstream",
                   upstream.base_url, "--samples", "2", "--parallel", "4", "--run-id", run_id, "--agent-timeout",
                   "120", "--skip-preflight", "--no-process", "--image-map", f"@{images['map']}",
                   "--build-network", "host", timeout=TIMEOUT,
                   env=rollout_env(DOCKER_HOST=images["host"]))
    return run, proc, policy


def _why(run: Path, proc) -> str:
    out = [explain(proc)]
    for p in sorted((run / "samples").glob("*/*/*/*")) if (run / "samples").is_dir() else []:
        if p.name in ("agent.stdout", "agent.stderr", "verifier.log"):
            out.append(f"--- {p.relative_to(run)}\n{p.read_text(errors='replace')[-1200:]}")
    return "\n".join(out)


def _check(run: Path, proc, *, box: str, tasks=TASKS, extra: dict | None = None) -> dict:
    why = _why(run, proc)
    final = latest(results(run))
    want = {(t, k): ("completed", 1.0 if k == 0 else 0.0) for t in tasks for k in (0, 1)}
    want.update(extra or {})
    assert {key: (ln["status"], ln["reward"]) for key, ln in final.items()} == want, why
    doc = json.loads((run / "run.json").read_text())
    for task in tasks:
        env = doc["environments"][task]
        assert env["mode"] == "image" and env["image_id"].startswith("sha256:") and env["error"] is None, env
        assert env["substituted"] and all(local.startswith("polar-standin/") for _, local in env["substituted"])
        sample = json.loads((run / "samples" / task / "0" / "0" / "sample.json").read_text())
        assert sample["environment"]["image_id"] == env["image_id"] and sample["sandbox"] == box
        assert sample["agent"]["argv"][0].startswith("/run/polar/rt/"), sample["agent"]["argv"]
    assert doc["runtime"]["root"] and any(line.startswith("docker.io/library/python:3.12-slim=")
                                          for line in doc["image_map"])
    return doc


NETWORK_TASK = """[environment]
docker_image = "python:3.12-slim"
"""
NETWORK_TEST = """#!/bin/bash
# Harbor tasks do this (uvx / pip at verify time): there is no network in a sandbox here
pip download --retries 0 --no-deps --dest /tmp/wheels six==1.16.0
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


@pytest.mark.parametrize("box", ["docker", "bwrap"])
def test_2_1_scripted_policy_scores_each_published_task_in_its_image(box, images, cache_dir, tmp_path, upstream,
                                                                      monkeypatch):
    tasks = harbor_copy(tmp_path)
    extra = {}
    if box == "docker":  # and a verifier that needs the network
        net = tasks / "needs-network"
        (net / "tests").mkdir(parents=True)
        (net / "agent").mkdir()
        shutil.copyfile(HERE / "shellagent.py", net / "agent" / "shellagent.py")
        (net / "task.toml").write_text(NETWORK_TASK)
        (net / "instruction.md").write_text("Say done.\n")
        (net / "tests" / "test.sh").write_text(NETWORK_TEST)
        extra = {("needs-network", k): ("verifier_error", None) for k in (0, 1)}
    run, proc, _ = _rollout(tmp_path, upstream, monkeypatch, images, agent="python:shellagent:run", box=box,
                            tasks=tasks, run_id=f"img-py-{box}")
    _check(run, proc, box=box, extra=extra)
    if box == "docker":
        for k in (0, 1):
            line = latest(results(run))[("needs-network", k)]
            assert "the verifier needs the network" in line["error"], line
    # what the agent ran, it ran in the image: `tree` (not on this host) and the image's own python 3.12
    log = (run / "samples" / "dir-tree" / "0" / "0" / "agent.stdout").read_text()
    assert "[exit 0]" in log and shutil.which("tree") is None


@pytest.mark.parametrize("box", ["docker", "bwrap"])
def test_2_2_pi_scores_each_published_task_in_its_image(box, images, cache_dir, tmp_path, upstream, monkeypatch):
    require_cli("pi")
    tasks = harbor_copy(tmp_path, agent=False)
    run, proc, policy = _rollout(tmp_path, upstream, monkeypatch, images, agent="pi", box=box, tasks=tasks,
                                 run_id=f"img-pi-{box}")
    _check(run, proc, box=box)
    for task in TASKS:
        assert sorted(x for x in policy.seen.get(task, []) if x.startswith(("solve", "noop"))) == [
            "noop:1", "solve:0"], policy.seen


# ---------------------------------------------------------------------------------------------------------------------
# 3.x --resume


def test_3_1_resume_refuses_changed_images(images, cache_dir, tmp_path, upstream):
    tasks = harbor_copy(tmp_path)
    run = tmp_path / "run"
    (run).mkdir()
    env = rollout_env(DOCKER_HOST=images["host"])
    args = (str(tasks / "log-report"), "--agent", "python:shellagent:run", "--out", str(run), "--sandbox", "docker",
            "--upstream", upstream.base_url, "--samples", "1", "--skip-preflight", "--no-process", "--image-map",
            f"@{images['map']}", "--build-network", "host", "--run-id", "img-resume")
    doc = {"version": 1, "run_id": "img-resume", "created": 0, "tasks": ["log-report"],
           "task_paths": {"log-report": str(tasks / "log-report")}, "agent": "python:shellagent:run", "samples": 1,
           "sandbox": "docker", "options": {}, "preflight": None,
           "environments": {"log-report": {"image_id": "sha256:" + "0" * 64}}}
    (run / "run.json").write_text(json.dumps(doc))
    (run / "results.jsonl").write_text("")
    proc = rollout(*args, "--resume", env=env, timeout=TIMEOUT)
    assert proc.returncode == 2, explain(proc)
    line = proc.stderr.strip().splitlines()[-1]
    assert "--resume: the image of 1 task(s) changed since the run started" in line and "log-report" in line, line
