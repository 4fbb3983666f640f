"""`polar-rollout --pull missing|never` against container registries on loopback that the test starts (Debian's
`docker-registry`, tests/rollout/registry.py): the only place in the suite where anything is pulled (the suite's
default is POLAR_ROLLOUT_PULL=never, tests/conftest.py).

1.1  a task whose docker_image only the registry has: --pull never is the task's infra_error naming the image (no
     reward); --pull missing pulls it and the sample runs in it (reward 1.0), while a task naming an image in a
     registry that wants credentials, and one in a registry that stopped, are infra_error with the registry's answer
1.2  a Dockerfile whose base only the registry has is built after the pull (the environment phase alone)
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from polar.rollout import overlay
from polar.rollout.images import environments as envlib
from polar.rollout.images.refs import parse_image_map
from polar.rollout.tasks import load_tasks
from tests.rollout import registry as reg
from tests.rollout.cli_policy import CliPolicy
from tests.rollout.rollout_support import HERE, explain, latest, results, rollout, rollout_env
from tests.support.need import need

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GREETING = ROOT / "examples" / "harbor" / "image-greeting"
PYTHON_STANDIN = "polar-standin/python:3.12-slim"
TIMEOUT = 400


def docker(host: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, input=input, timeout=300,
                          env={**rollout_env(), "DOCKER_HOST": host})


def push_only_there(host: str, addr: str, name: str) -> str:
    """An image built from the python stand-in (a label of its own, so a new image id), pushed to the registry at
    `addr` and removed from the daemon: only the registry has it."""
    ref = f"{addr}/polar-test/{name}:1"
    built = docker(host, "build", "-t", ref, "-", input=f"FROM {PYTHON_STANDIN}\nLABEL polar.test={name}\n")
    assert built.returncode == 0, built.stderr
    pushed = docker(host, "push", ref)
    assert pushed.returncode == 0, pushed.stderr
    assert docker(host, "rmi", ref).returncode == 0
    assert docker(host, "image", "inspect", ref).returncode != 0
    return ref


def greeting_task(tasks: Path, name: str, image: str) -> None:
    """examples/harbor/image-greeting (the scripted policy knows how to solve it) naming `image`."""
    dest = tasks / name
    shutil.copytree(GREETING, dest)
    toml = dest / "task.toml"
    toml.write_text(toml.read_text().replace('docker_image = "python:3.12-slim"', f'docker_image = "{image}"'))
    (dest / "agent").mkdir()
    shutil.copyfile(HERE / "shellagent.py", dest / "agent" / "shellagent.py")


def run_pull(tmp_path, tasks: Path, images, upstream, pull: str, run_id: str):
    run = tmp_path / run_id
    proc = rollout(str(tasks), "--agent", "python:shellagent:run", "--out", str(run), "--sandbox", "docker",
                   "--upstream", upstream.base_url, "--samples", "1", "--run-id", run_id, "--agent-timeout", "120",
                   "--skip-preflight", "--no-process", "--image-map", f"@{images['map']}", "--pull", pull,
                   timeout=TIMEOUT, env=rollout_env(DOCKER_HOST=images["host"]))
    return run, proc


def test_1_1_pull_missing_runs_what_only_the_registry_has_and_names_each_refusal(images, cache_dir, tmp_path,
                                                                                 upstream, monkeypatch):
    need(reg.why_not())
    host = images["host"]
    monkeypatch.setattr(upstream, "_next_reply", CliPolicy("pi", solves=frozenset({0})).bind(upstream),
                        raising=False)
    with reg.registry(tmp_path / "open") as addr, reg.registry(tmp_path / "locked", auth=True) as locked:
        only = push_only_there(host, addr, "only-here")
        with reg.registry(tmp_path / "stopped") as gone:
            pass
        tasks = tmp_path / "tasks"
        greeting_task(tasks, "image-greeting", only)
        never, proc = run_pull(tmp_path, tasks, images, upstream, "never", "pull-never")
        line = latest(results(never))[("image-greeting", 0)]
        assert (line["status"], line["reward"]) == ("infra_error", None), explain(proc)
        assert f"image {only} is not in the local docker daemon" in line["error"], line["error"]
        assert docker(host, "image", "inspect", only).returncode != 0  # never: nothing was pulled

        greeting_task(tasks, "locked", f"{locked}/polar-test/only-here:1")
        greeting_task(tasks, "stopped", f"{gone}/polar-test/only-here:1")
        run, proc = run_pull(tmp_path, tasks, images, upstream, "missing", "pull-missing")
    final = {t: (ln["status"], ln["reward"], ln["error"] or "") for (t, _), ln in latest(results(run)).items()}
    assert final["image-greeting"][:2] == ("completed", 1.0), explain(proc)
    assert final["locked"][:2] == ("infra_error", None) and final["stopped"][:2] == ("infra_error", None)
    assert f"image {locked}/polar-test/only-here:1 could not be pulled" in final["locked"][2]
    assert "no basic auth credentials" in final["locked"][2], final["locked"]
    assert f"image {gone}/polar-test/only-here:1 could not be pulled" in final["stopped"][2]
    assert "connection refused" in final["stopped"][2], final["stopped"]
    doc = json.loads((run / "run.json").read_text())
    assert doc["options"]["pull"] == "missing"
    # the pulled image's WORKDIR is the sample's through an overlay where the runner can mount one (root), and the
    # verifier read the agent's work through its own overlay on it (the reward above)
    sample = json.loads((run / "samples" / "image-greeting" / "0" / "0" / "sample.json").read_text())
    assert sample["workdir_view"] == ("overlay" if overlay.why_no_overlay(str(run / ".work")) is None else "copy")
    assert not list((run / ".work").iterdir())  # every view unmounted and removed at the sample's teardown
    assert doc["environments"]["image-greeting"]["image_id"] == docker(
        host, "image", "inspect", "-f", "{{.Id}}", only).stdout.strip()


def test_1_2_a_dockerfile_base_only_the_registry_has_is_pulled_then_built(images, cache_dir, tmp_path):
    need(reg.why_not())
    with reg.registry(tmp_path / "open") as addr:
        base = push_only_there(images["host"], addr, "base")
        task = tmp_path / "tasks" / "from-registry"
        (task / "environment").mkdir(parents=True)
        (task / "tests").mkdir()
        (task / "task.toml").write_text('version = "1.0"\n')
        (task / "instruction.md").write_text("Nothing.\n")
        (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
        (task / "environment" / "Dockerfile").write_text(f"FROM {base}\nWORKDIR /app\n")
        envs = {}
        for pull in ("never", "missing"):
            opts = envlib.PhaseOptions(image=None, image_map=parse_image_map([f"@{images['map']}"]),
                                       build_network="none", sandbox="docker", builds_dir=tmp_path / "builds",
                                       pull=pull)
            envs[pull] = envlib.prepare(load_tasks([tmp_path / "tasks"]), opts, log=lambda line: None)["from-registry"]
    assert f"image {base} is not in the local docker daemon" in envs["never"].error
    assert envs["missing"].error is None and envs["missing"].built, envs["missing"].error
