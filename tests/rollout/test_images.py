"""Task images (polar.rollout.images), rules 5–6 and the contract (pure: no docker, no sockets, no processes).

Rules 1–4 are tested beside their modules: tests/rollout/test_image_refs.py, test_dockerfile.py, test_compose.py.
5.x  the cache key: the same tree → the same key; a byte, mode, name, link, base id or the Dockerfile → another
6.x  the choice: --image > docker_image > environment/Dockerfile > compose > environment/workdir/ > empty, with notes
7.x  the contract: frozen results, ImageError is a ValueError, every error one line, rules 1–4's names re-exported
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

import pytest

from polar.rollout.images.compose import compose_service
from polar.rollout.images.refs import ImageError, ImageRef
from polar.rollout.images.sources import Choice, choose_environment, environment_key
from tests.rollout.test_dockerfile import rewrite
from tests.rollout.test_image_refs import mapping, refused

pytestmark = pytest.mark.unit

# 5.x the cache key

def make_env(root: Path) -> Path:
    env = root / "environment"
    (env / "workdir" / "src").mkdir(parents=True)
    (env / "empty").mkdir()
    (env / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY workdir/ /app/\n")
    (env / ".dockerignore").write_text("*.pyc\n")
    (env / "workdir" / "src" / "main.py").write_text("print('hi')\n")
    (env / "workdir" / "run.sh").write_text("#!/bin/sh\n")
    (env / "workdir" / "run.sh").chmod(0o755)
    (env / "workdir" / "data.bin").write_bytes(bytes(range(256)) * 10)
    os.symlink("src/main.py", env / "workdir" / "link")
    return env


KEY_ARGS = ("FROM local/py312\nCOPY workdir/ /app/\n", {"local/py312": "sha256:" + "1" * 64})


def test_5_1_the_same_tree_gives_the_same_key(tmp_path):
    first = make_env(tmp_path / "a")
    second = make_env(tmp_path / "b")
    key = environment_key(first, *KEY_ARGS)
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    assert environment_key(second, *KEY_ARGS) == key == environment_key(str(first), *KEY_ARGS)
    copied = tmp_path / "c"
    shutil.copytree(first, copied, symlinks=True)
    assert environment_key(copied, *KEY_ARGS) == key


@pytest.mark.parametrize("change", [
    "byte", "chmod", "rename", "move", "symlink", "empty-dir", "hidden-file", "dockerignore", "dir-mode",
    "base-id", "base-name", "dockerfile", "extra-base",
])
def test_5_2_any_change_gives_another_key(tmp_path, change):
    env = make_env(tmp_path)
    dockerfile, ids = KEY_ARGS[0], dict(KEY_ARGS[1])
    before = environment_key(env, dockerfile, ids)
    work = env / "workdir"
    if change == "byte":
        data = bytearray((work / "data.bin").read_bytes())
        data[1000] ^= 1
        (work / "data.bin").write_bytes(bytes(data))
    elif change == "chmod":
        (work / "src" / "main.py").chmod(0o755)
    elif change == "rename":
        (work / "run.sh").rename(work / "run2.sh")
    elif change == "move":
        (work / "run.sh").rename(work / "src" / "run.sh")
    elif change == "symlink":
        (work / "link").unlink()
        os.symlink("run.sh", work / "link")
    elif change == "empty-dir":
        (env / "another").mkdir()
    elif change == "hidden-file":
        (work / ".env").write_text("")
    elif change == "dockerignore":
        (env / ".dockerignore").write_text("*.pyo\n")
    elif change == "dir-mode":
        (env / "empty").chmod(0o700)
    elif change == "base-id":
        ids["local/py312"] = "sha256:" + "2" * 64
    elif change == "base-name":
        ids = {"local/py313": ids["local/py312"]}
    elif change == "dockerfile":
        dockerfile = dockerfile.replace("/app/", "/app")
    elif change == "extra-base":
        ids["local/go"] = "sha256:" + "3" * 64
    assert environment_key(env, dockerfile, ids) != before


def test_5_3_big_files_are_read_in_chunks_and_a_missing_directory_is_refused(tmp_path):
    env = tmp_path / "env"
    env.mkdir()
    data = bytearray(3 * (1 << 20) + 5)
    (env / "big").write_bytes(bytes(data))
    before = environment_key(env, "", {})
    data[-1] = 1
    (env / "big").write_bytes(bytes(data))
    assert environment_key(env, "", {}) != before
    assert refused(environment_key, tmp_path / "nowhere", "", {}).startswith(
        "environment/: cannot be listed (No such file or directory);")


def test_5_4_the_order_of_base_ids_does_not_matter_and_parts_do_not_run_together(tmp_path):
    env = tmp_path / "env"
    env.mkdir()
    assert environment_key(env, "", {"a": "1", "b": "2"}) == environment_key(env, "", {"b": "2", "a": "1"})
    assert environment_key(env, "", {"ab": "c"}) != environment_key(env, "", {"a": "bc"})
    (env / "ab").write_text("")
    one = environment_key(env, "", {})
    (env / "ab").unlink()
    (env / "a").write_text("b")
    assert environment_key(env, "", {}) != one


# 6.x the choice

def make_task(root: Path, files: dict[str, str] | None = None, *, workdir: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.toml").write_text("")
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    if workdir:
        (root / "environment" / "workdir").mkdir(parents=True, exist_ok=True)
    return root


ALL = {"environment/Dockerfile": "FROM ubuntu\n", "environment/docker-compose.yaml": "services:\n  a:\n    image: x\n"}


def test_6_1_the_command_line_image_wins_and_notes_everything_else(tmp_path):
    task = make_task(tmp_path / "t", ALL, workdir=True)
    choice = choose_environment(task, "task/image:1", "mine:2")
    assert (choice.kind, choice.source, choice.image) == ("image", "--image", "mine:2")
    assert choice.workdir == task / "environment" / "workdir"  # the user's runtime still gets the start state
    assert choice.notes == (
        "task.toml's docker_image task/image:1 is not run: --image was given on the command line, which comes first",
        "environment/Dockerfile is not built: --image was given on the command line, which comes first",
        "environment/docker-compose.yaml is not read: --image was given on the command line, which comes first",
    )


def test_6_2_task_toml_docker_image_comes_next_and_carries_its_start_state(tmp_path):
    task = make_task(tmp_path / "t", ALL, workdir=True)
    choice = choose_environment(task, "task/image:1", None)
    assert (choice.kind, choice.source, choice.image, choice.workdir) == \
        ("image", "task.toml docker_image", "task/image:1", None)
    assert choice.notes[0] == "environment/Dockerfile is not built: task.toml names docker_image, which comes first"
    assert choice.notes[-1].startswith("environment/workdir/ is not copied into /app: task.toml names docker_image")


def test_6_3_a_dockerfile_is_built_before_a_compose_file_and_workdir(tmp_path):
    task = make_task(tmp_path / "t", ALL, workdir=True)
    choice = choose_environment(task, None, None)
    env = task / "environment"
    assert choice == Choice("build", "environment/Dockerfile", context=env, dockerfile=env / "Dockerfile",
                            notes=choice.notes)
    assert choice.notes == (
        "environment/docker-compose.yaml is not read: environment/Dockerfile is built, which comes first",
        "environment/workdir/ is not copied into /app: environment/Dockerfile is built, and the image holds the start "
        "state (the build context is environment/, so a Dockerfile may COPY workdir/)")


def test_6_4_a_single_service_compose_file_is_built_or_run(tmp_path):
    built = make_task(tmp_path / "built", {"environment/compose.yaml": "services:\n  a:\n    build:\n"
                                           "      context: ctx\n      dockerfile: D\n",
                                           "environment/docker-compose.yml": "not read at all: {[\n"})
    choice = choose_environment(built, None, None)
    env = built / "environment"
    assert (choice.kind, choice.source, choice.context, choice.dockerfile) == \
        ("build", "environment/compose.yaml", env / "ctx", env / "ctx" / "D")
    assert choice.notes == ("environment/docker-compose.yml is not read: environment/compose.yaml comes first "
                            "(compose.yaml, compose.yml, docker-compose.yaml, docker-compose.yml)",)
    ran = make_task(tmp_path / "ran", {"environment/docker-compose.yaml": "services:\n  a:\n    image: x:1\n"})
    assert choose_environment(ran, None, None) == Choice("image", "environment/docker-compose.yaml", image="x:1")


def test_6_5_workdir_alone_and_nothing_at_all(tmp_path):
    task = make_task(tmp_path / "w", workdir=True)
    assert choose_environment(task, None, None) == Choice("workdir", "environment/workdir/",
                                                          workdir=task / "environment" / "workdir")
    assert choose_environment(make_task(tmp_path / "none"), None, None) == Choice("empty", "none")
    assert choose_environment(make_task(tmp_path / "empty-strings"), "", "") == Choice("empty", "none")


def test_6_6_other_dockerfile_names_are_noted_not_built(tmp_path):
    task = make_task(tmp_path / "t", {"environment/Dockerfile.dev": "FROM x\n", "environment/app.Dockerfile": ""},
                     workdir=True)
    choice = choose_environment(task, None, None)
    assert choice.kind == "workdir" and choice.notes == (
        "environment/Dockerfile.dev is not built: only environment/Dockerfile is",
        "environment/app.Dockerfile is not built: only environment/Dockerfile is")


def test_6_7_bad_inputs_are_refused_in_one_line(tmp_path):
    task = make_task(tmp_path / "t", {"environment/compose.yaml": "services:\n  a:\n    image: x\n  b:\n"
                                                                  "    image: y\n"})
    assert refused(choose_environment, task, None, None).startswith(
        "environment/compose.yaml line 1: it has 2 services (a, b); polar-rollout runs one;")
    assert choose_environment(task, None, "mine").kind == "image"  # --image: the compose file is not read
    assert refused(choose_environment, task, "Bad Image", None).startswith(
        "task.toml [environment] docker_image: image reference 'Bad Image':")
    assert refused(choose_environment, task, None, "UPPER").startswith("--image: image reference 'UPPER':")


# 7.x the contract

def test_7_1_results_are_frozen_and_hashable(tmp_path):
    result = rewrite("FROM python:3.12-slim\n")
    choice = choose_environment(make_task(tmp_path / "t", workdir=True), None, None)
    service = compose_service("services:\n  a:\n    build: .\n")
    image_map = mapping("python=a")
    for value in (result, choice, service, image_map, ImageRef.parse("python")):
        assert hash(value) == hash(value)
        with pytest.raises(dataclasses.FrozenInstanceError):
            object.__getattribute__(value, "__setattr__")("x", 1)


def test_7_2_image_error_is_a_value_error():
    assert issubclass(ImageError, ValueError)

