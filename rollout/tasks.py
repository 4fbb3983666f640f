"""Harbor tasks, read by the project itself (no `harbor` dependency: the PyPI package is the whole framework).

A task is a directory: `task.toml`, `instruction.md`, `tests/test.sh`, and optionally `environment/`, `solution/`
(`solve.sh`) and `agent/` (python agents import their MODULE from here first). The start state is
`environment/workdir/` (our extension of Harbor, whose `environment/` is a Dockerfile or compose file), copied fresh
into `/app` for every sample.

Rules. Each violation is a `TaskError` whose text is one line naming the task (or the path) and the fix.
1. TASKS are task directories (they hold `task.toml`) or folders holding them: every immediate subdirectory with a
   `task.toml`, sorted by name. A path that is neither is refused, naming the path.
2. The task id is the directory's name and matches `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`; ids are unique across all
   TASKS (the error names both directories).
3. `task.toml` parses as TOML (the error gives its line). Read: `[agent] timeout_sec`, `[verifier] timeout_sec`,
   `[environment] cpus` and `build_timeout_sec` — positive finite numbers —, `[environment] memory_mb` and
   `storage_mb`, positive whole numbers, `[environment] docker_image`, an image reference (a string), `[environment]
   env`, a table of strings, and `[environment] allow_internet`, a boolean (Harbor's default is true; sandboxes here
   never reach anything but the proxy: the runner reports it once per run). Every other key is kept in `Task.extra`
   and ignored.
4. `instruction.md` exists and holds text (UTF-8); `tests/test.sh` exists.
5. `environment/workdir/` is the start state of the host view. No `environment/` at all (or an empty one) means an
   empty start state. An `environment/` with a Dockerfile or compose file (or a task naming `docker_image`) is an
   image task: its start state is the image's WORKDIR, and which source is used is polar.rollout.images'
   `choose_environment` (`workdir` is then what that rule copies, possibly None). An `environment/` holding other
   files but no `workdir/`, no Dockerfile and no compose file is refused: nothing there would reach the sandbox.
"""

from __future__ import annotations

import copy
import math
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
COMPOSE_FILES = frozenset({"docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml"})

# (table, key) → kind, for every task.toml key the runner reads; everything else goes to Task.extra.
READ_KEYS: dict[tuple[str, str], str] = {
    ("agent", "timeout_sec"): "seconds",
    ("verifier", "timeout_sec"): "seconds",
    ("environment", "cpus"): "cpus",
    ("environment", "memory_mb"): "mebibytes",
    ("environment", "storage_mb"): "mebibytes",
    ("environment", "build_timeout_sec"): "seconds",
    ("environment", "docker_image"): "image",
    ("environment", "env"): "env",
    ("environment", "allow_internet"): "bool",
}


class TaskError(ValueError):
    """A task (or a TASKS path) the runner cannot use; str() is one line naming the task and the fix."""


@dataclass(frozen=True)
class Task:
    """One Harbor task directory, checked. Paths are absolute; optional parts are None when absent."""

    id: str  # the directory's name; matches TASK_ID
    path: Path  # the task directory (absolute)
    instruction: str  # instruction.md's text: the agent's prompt
    agent_timeout_sec: float | None  # [agent] timeout_sec
    verifier_timeout_sec: float | None  # [verifier] timeout_sec
    cpus: float | None  # [environment] cpus
    memory_mb: int | None  # [environment] memory_mb
    workdir: Path | None  # environment/workdir/: the start state, copied fresh per sample; None = an empty /app
    tests_dir: Path  # tests/ (holds test.sh); mounted read-only at /tests for the verifier, never for the agent
    solution_dir: Path | None  # solution/ when it holds solve.sh
    agent_dir: Path | None  # agent/: python agents import MODULE from here first
    extra: dict = field(default_factory=dict, hash=False)  # unknown task.toml keys, kept and ignored
    storage_mb: int | None = None  # [environment] storage_mb: the size of the sandbox's /tmp
    build_timeout_sec: float | None = None  # [environment] build_timeout_sec: the image build's limit
    docker_image: str | None = None  # [environment] docker_image: run as given (mapped by --image-map)
    env: dict = field(default_factory=dict, hash=False)  # [environment] env: set for the agent and the verifier
    allow_internet: bool | None = None  # [environment] allow_internet as written (never honoured: reported)
    image_task: bool = False  # environment/ holds a Dockerfile or compose file, or docker_image is named


def load_tasks(paths: Sequence[str | Path]) -> list[Task]:
    """Every task under TASKS, in the order given (a folder's tasks sorted by name); ids unique across all of them."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise TaskError("no TASKS given; pass task directories (holding task.toml) or folders holding them")
    tasks: list[Task] = []
    seen: dict[str, Path] = {}
    for given in paths:
        for directory in task_dirs(given):
            task = load_task(directory)
            if task.id in seen:
                raise TaskError(
                    f"task {task.id}: the id is taken twice, by {seen[task.id]} and {task.path}; task ids must be "
                    f"unique across TASKS (rename one directory, or pass it once)")
            seen[task.id] = task.path
            tasks.append(task)
    return tasks


def task_dirs(given: str | Path) -> list[Path]:
    """Rule 1: the task directories one TASKS path names (absolute, symlinks kept so the id is the name given)."""
    path = Path(os.path.abspath(given))
    if not path.exists():
        raise TaskError(f"TASKS path {given}: no such file or directory; pass a task directory (holding task.toml) "
                        f"or a folder holding them")
    if not path.is_dir():
        hint = f"pass its directory {path.parent}" if path.name == "task.toml" else "pass a task directory"
        raise TaskError(f"TASKS path {given}: not a directory; {hint} (holding task.toml) or a folder holding them")
    if (path / "task.toml").is_file():
        return [path]
    found = sorted((child for child in path.iterdir() if child.is_dir() and (child / "task.toml").is_file()),
                   key=lambda child: child.name)
    if not found:
        raise TaskError(f"TASKS path {given}: neither a task directory nor a folder holding them (no task.toml in it "
                        f"or in its immediate subdirectories); pass a directory holding task.toml")
    return found


def load_task(directory: str | Path) -> Task:
    """Rules 2–5 for one task directory (one that holds task.toml)."""
    path = Path(os.path.abspath(directory))
    task_id = path.name
    if not TASK_ID.fullmatch(task_id):
        raise TaskError(f"task directory {path}: its name {task_id!r} is not a task id ([A-Za-z0-9] then up to 127 "
                        f"of [A-Za-z0-9._-]); rename the directory")

    def fail(problem: str, fix: str) -> TaskError:
        return TaskError(f"task {task_id}: {problem}; {fix}")

    config = _read_toml(path / "task.toml", fail)
    numbers = _read_numbers(config, fail)
    instruction = _read_instruction(path / "instruction.md", fail)
    tests_dir = path / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise fail("tests/test.sh is missing", f"add the verifier script {tests_dir / 'test.sh'} (it writes "
                                               f"/logs/verifier/reward.txt or reward.json)")
    solution_dir = path / "solution"
    agent_dir = path / "agent"
    docker_image = numbers.get(("environment", "docker_image"))
    workdir, image_files = _start_state(path / "environment", docker_image is not None, fail)
    return Task(
        id=task_id,
        path=path,
        instruction=instruction,
        agent_timeout_sec=numbers.get(("agent", "timeout_sec")),
        verifier_timeout_sec=numbers.get(("verifier", "timeout_sec")),
        cpus=numbers.get(("environment", "cpus")),
        memory_mb=numbers.get(("environment", "memory_mb")),
        workdir=workdir,
        tests_dir=tests_dir,
        solution_dir=solution_dir if (solution_dir / "solve.sh").is_file() else None,
        agent_dir=agent_dir if agent_dir.is_dir() else None,
        extra=_unread(config),
        storage_mb=numbers.get(("environment", "storage_mb")),
        build_timeout_sec=numbers.get(("environment", "build_timeout_sec")),
        docker_image=docker_image,
        env=numbers.get(("environment", "env")) or {},
        allow_internet=numbers.get(("environment", "allow_internet")),
        image_task=image_files or docker_image is not None,
    )


def _read_toml(file: Path, fail) -> dict:
    try:
        with open(file, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:  # its text ends "(at line L, column C)"
        raise fail(f"task.toml is not valid TOML: {exc}", "fix the TOML syntax there") from None
    except UnicodeDecodeError as exc:
        raise fail(f"task.toml is not UTF-8 ({exc.reason} at byte {exc.start})", "save it as UTF-8") from None
    except OSError as exc:
        raise fail(f"task.toml cannot be read ({exc.strerror})", "make it a readable file") from None


def _read_numbers(config: dict, fail) -> dict[tuple[str, str], Any]:
    """Rule 3: the keys the runner reads, each checked; absent keys stay absent."""
    out: dict[tuple[str, str], Any] = {}
    for table in sorted({table for table, _ in READ_KEYS}):
        if table in config and not isinstance(config[table], dict):
            raise fail(f"task.toml's {table} is not a table", f"write it as a [{table}] section")
    for (table, key), kind in READ_KEYS.items():
        value = config.get(table, {}).get(key)
        if value is None:
            continue
        if kind == "image":
            if not isinstance(value, str) or not value.strip():
                raise fail(f"task.toml [{table}] {key} = {value!r} is not an image reference",
                           f"set it to an image name, e.g. {key} = \"python:3.12-slim\", or remove it")
            out[(table, key)] = value.strip()
            continue
        if kind == "env":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()) or \
                    not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in value):
                raise fail(f"task.toml [{table}] {key} is not a table of NAME = \"string\" entries",
                           f"write it as [{table}.{key}] with one NAME = \"value\" a line, or remove it")
            out[(table, key)] = dict(value)
            continue
        if kind == "bool":
            if not isinstance(value, bool):
                raise fail(f"task.toml [{table}] {key} = {value!r} is not true or false", "set it to true or false")
            out[(table, key)] = value
            continue
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if kind == "mebibytes":
            if isinstance(number, float) and number.is_integer():
                number = int(number)
            if not isinstance(number, int) or number <= 0:
                raise fail(f"task.toml [{table}] {key} = {value!r} is not a positive whole number",
                           f"set it to the memory limit in MiB, e.g. {key} = 2048, or remove it")
            out[(table, key)] = number
            continue
        if number is None or not math.isfinite(number) or number <= 0:
            example = "timeout_sec = 600" if kind == "seconds" else "cpus = 1"
            unit = "of seconds" if kind == "seconds" else "of CPUs"
            raise fail(f"task.toml [{table}] {key} = {value!r} is not a positive number {unit}",
                       f"set it, e.g. {example}, or remove it")
        out[(table, key)] = float(number)
    return out


def _unread(config: dict) -> dict:
    """task.toml without the keys the runner reads (tables left empty by that dropped too)."""
    extra = copy.deepcopy(config)
    for table, key in READ_KEYS:
        section = extra.get(table)
        if isinstance(section, dict):
            section.pop(key, None)
            if not section:
                del extra[table]
    return extra


def _read_instruction(file: Path, fail) -> str:
    if not file.is_file():
        raise fail("instruction.md is missing", f"add {file} with the agent's instruction")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"instruction.md is not UTF-8 ({exc.reason} at byte {exc.start})", "save it as UTF-8") from None
    except OSError as exc:
        raise fail(f"instruction.md cannot be read ({exc.strerror})", "make it a readable file") from None
    if not text.strip():
        raise fail("instruction.md is empty", "write the agent's instruction in it")
    return text


def _start_state(environment: Path, names_image: bool, fail) -> tuple[Path | None, bool]:
    """Rule 5: (environment/workdir/ or None for an empty /app, whether environment/ holds an image file)."""
    workdir = environment / "workdir"
    if workdir.exists() and not workdir.is_dir():
        raise fail("environment/workdir is not a directory", "make it the folder holding the start state of /app")
    if environment.exists() and not environment.is_dir():
        raise fail("environment is not a directory",
                   "make it a folder holding workdir/ (the start state) or a Dockerfile, or remove it")
    names = sorted(entry.name for entry in environment.iterdir()) if environment.is_dir() else []
    images = any(_is_image_file(name) for name in names)
    if workdir.is_dir() or images or names_image or not names:
        return (workdir if workdir.is_dir() else None), images
    visible = [name for name in names if not name.startswith(".")]
    if visible:
        raise fail(f"environment/ holds {', '.join(visible[:3])}{' …' if len(visible) > 3 else ''} but no workdir/ "
                   f"and no Dockerfile (nothing there reaches the sandbox)",
                   "move the start state into environment/workdir/, or add the Dockerfile that uses it")
    return None, False


def _is_image_file(name: str) -> bool:
    lower = name.lower()
    return lower == "dockerfile" or lower.startswith("dockerfile.") or lower.endswith(".dockerfile") \
        or lower in COMPOSE_FILES
