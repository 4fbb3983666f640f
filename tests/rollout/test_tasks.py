"""The Harbor task reader (polar.rollout.tasks), rule by rule (no sockets, no processes).

1.x  TASKS: task directories, folders holding them, anything else refused naming the path
2.x  task ids: the directory's name, the pattern, unique across TASKS
3.x  task.toml: TOML errors with their line, the four numbers read and checked, unknown keys kept
4.x  instruction.md, tests/test.sh, solution/, agent/
5.x  the start state: environment/workdir/, none, an image task (a Dockerfile, a compose file or docker_image), or
     other files refused; the Harbor [environment] keys read and checked
6.x  the contract: frozen, hashable, every error one line naming the task
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from polar.rollout.tasks import Task, TaskError, load_task, load_tasks

pytestmark = pytest.mark.unit

FULL_TOML = """\
version = "1.0"

[metadata]
author_name = "Polar"
tags = ["x"]

[agent]
timeout_sec = 600
user = "agent"

[verifier]
timeout_sec = 30.5

[environment]
cpus = 2
memory_mb = 4096
storage_mb = 10240
"""


def make_task(root: Path, name: str = "t1", toml: str = "", *, instruction: str = "Do it.\n",
              test_sh: bool = True, workdir: bool = True, files: dict[str, str] | None = None) -> Path:
    """A task directory under root: task.toml, instruction.md, tests/test.sh, environment/workdir/ + files."""
    path = root / name
    path.mkdir(parents=True)
    (path / "task.toml").write_text(toml)
    if instruction is not None:
        (path / "instruction.md").write_text(instruction)
    if test_sh:
        (path / "tests").mkdir()
        (path / "tests" / "test.sh").write_text("echo 1.0 > /logs/verifier/reward.txt\n")
    if workdir:
        (path / "environment" / "workdir").mkdir(parents=True)
        (path / "environment" / "workdir" / "start.txt").write_text("start\n")
    for rel, text in (files or {}).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


def refused(*args, **kwargs) -> str:
    """load_tasks' TaskError text, checked to be one line."""
    with pytest.raises(TaskError) as info:
        load_tasks(*args, **kwargs)
    text = str(info.value)
    assert "\n" not in text and text.strip() == text and text
    return text


# 1.x TASKS paths

def test_1_1_a_task_directory_gives_one_task_with_every_field(tmp_path):
    path = make_task(tmp_path, "fix-bug", FULL_TOML, files={"solution/solve.sh": "true\n", "agent/mine.py": ""})
    [task] = load_tasks([path])
    assert task == Task(
        id="fix-bug", path=path, instruction="Do it.\n", agent_timeout_sec=600.0, verifier_timeout_sec=30.5,
        cpus=2.0, memory_mb=4096, workdir=path / "environment" / "workdir", tests_dir=path / "tests",
        solution_dir=path / "solution", agent_dir=path / "agent",
        extra={"version": "1.0", "metadata": {"author_name": "Polar", "tags": ["x"]}, "agent": {"user": "agent"}},
        storage_mb=10240)
    assert type(task.agent_timeout_sec) is float and type(task.cpus) is float and type(task.memory_mb) is int


def test_1_2_a_folder_gives_its_immediate_task_directories_sorted(tmp_path):
    for name in ("b", "a", "C"):
        make_task(tmp_path, name)
    (tmp_path / "README.md").write_text("not a task")
    (tmp_path / "notes").mkdir()  # a subdirectory without task.toml is not a task
    make_task(tmp_path / "notes", "deeper")  # only immediate subdirectories count
    assert [t.id for t in load_tasks([tmp_path])] == ["C", "a", "b"]


def test_1_3_paths_keep_their_order_and_may_be_relative(tmp_path, monkeypatch):
    make_task(tmp_path / "set1", "z")
    make_task(tmp_path / "set2", "a")
    monkeypatch.chdir(tmp_path)
    tasks = load_tasks(["set1/z", Path("set2")])
    assert [t.id for t in tasks] == ["z", "a"]
    assert all(t.path.is_absolute() and t.tests_dir.is_absolute() for t in tasks)


def test_1_4_a_path_that_does_not_exist_is_named(tmp_path):
    text = refused([tmp_path / "nowhere"])
    assert text.startswith(f"TASKS path {tmp_path / 'nowhere'}: no such file or directory;")


def test_1_5_a_file_is_refused_and_task_toml_points_at_its_directory(tmp_path):
    path = make_task(tmp_path, "t1")
    assert "not a directory" in refused([path / "instruction.md"])
    assert f"pass its directory {path}" in refused([path / "task.toml"])


def test_1_6_a_folder_without_tasks_is_refused(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    text = refused([tmp_path / "empty"])
    assert text.startswith(f"TASKS path {tmp_path / 'empty'}: neither a task directory nor a folder holding them")


def test_1_7_no_paths_at_all_is_refused():
    assert refused([]).startswith("no TASKS given;")


# 2.x ids

@pytest.mark.parametrize("name", ["-lead", ".hidden", "_under", "has space", "x" * 129, "ünï", "a+b"])
def test_2_1_a_directory_name_that_is_not_an_id_is_refused(tmp_path, name):
    make_task(tmp_path, name)
    text = refused([tmp_path / name])
    assert text.startswith(f"task directory {tmp_path / name}: its name {name!r} is not a task id")
    assert text.endswith("rename the directory")


@pytest.mark.parametrize("name", ["a", "7", "A.b_c-1", "x" * 128])
def test_2_2_names_that_match_the_pattern_are_ids(tmp_path, name):
    make_task(tmp_path, name)
    assert load_tasks([tmp_path / name])[0].id == name


def test_2_3_an_id_taken_twice_names_both_directories(tmp_path):
    first = make_task(tmp_path / "set1", "same")
    second = make_task(tmp_path / "set2", "same")
    text = refused([tmp_path / "set1", tmp_path / "set2"])
    assert text.startswith(f"task same: the id is taken twice, by {first} and {second};")
    assert "unique across TASKS" in text


def test_2_4_the_same_directory_passed_twice_is_refused(tmp_path):
    make_task(tmp_path, "t1")
    assert "taken twice" in refused([tmp_path, tmp_path / "t1"])


# 3.x task.toml

def test_3_1_a_toml_syntax_error_gives_its_line(tmp_path):
    make_task(tmp_path, "t1", '[agent]\ntimeout_sec = 10\n[verifier\n')
    text = refused([tmp_path / "t1"])
    assert text.startswith("task t1: task.toml is not valid TOML:") and "line 3" in text
    assert text.endswith("fix the TOML syntax there")


@pytest.mark.parametrize("section,key,value", [
    ("agent", "timeout_sec", "0"),
    ("agent", "timeout_sec", "-5"),
    ("agent", "timeout_sec", '"600"'),
    ("agent", "timeout_sec", "true"),
    ("verifier", "timeout_sec", "nan"),
    ("verifier", "timeout_sec", "inf"),
    ("environment", "cpus", "0"),
    ("environment", "cpus", "-0.5"),
    ("environment", "memory_mb", "0"),
    ("environment", "memory_mb", "1.5"),
    ("environment", "memory_mb", '"2G"'),
    ("environment", "memory_mb", "[2048]"),
])
def test_3_2_each_number_read_must_be_positive(tmp_path, section, key, value):
    make_task(tmp_path, "t1", f"[{section}]\n{key} = {value}\n")
    text = refused([tmp_path / "t1"])
    assert text.startswith(f"task t1: task.toml [{section}] {key} = ")
    assert "positive" in text and "or remove it" in text


def test_3_3_whole_floats_are_memory_and_ints_are_seconds(tmp_path):
    make_task(tmp_path, "t1", "[agent]\ntimeout_sec = 5\n[environment]\ncpus = 0.5\nmemory_mb = 2048.0\n")
    task = load_tasks([tmp_path / "t1"])[0]
    assert (task.agent_timeout_sec, task.cpus, task.memory_mb) == (5.0, 0.5, 2048)
    assert type(task.memory_mb) is int


@pytest.mark.parametrize("section", ["agent", "verifier", "environment"])
def test_3_4_a_section_that_is_not_a_table_is_refused(tmp_path, section):
    make_task(tmp_path, "t1", f"{section} = 5\n")
    assert refused([tmp_path / "t1"]) == \
        f"task t1: task.toml's {section} is not a table; write it as a [{section}] section"


def test_3_5_an_empty_task_toml_reads_nothing_and_keeps_nothing(tmp_path):
    make_task(tmp_path, "t1", "")
    task = load_tasks([tmp_path / "t1"])[0]
    assert (task.agent_timeout_sec, task.verifier_timeout_sec, task.cpus, task.memory_mb, task.extra) == \
        (None, None, None, None, {})


def test_3_6_unknown_keys_are_kept_and_the_read_ones_left_out(tmp_path):
    make_task(tmp_path, "t1", '[verifier]\ntimeout_sec = 9\nenv = { A = "1" }\n[solution]\nenv = {}\n')
    assert load_tasks([tmp_path / "t1"])[0].extra == {"verifier": {"env": {"A": "1"}}, "solution": {"env": {}}}


def test_3_7_a_task_toml_that_is_not_utf8_is_refused(tmp_path):
    path = make_task(tmp_path, "t1")
    (path / "task.toml").write_bytes(b'name = "\xff"\n')
    text = refused([path])
    assert text.startswith("task t1: task.toml is not") and text.endswith("UTF-8")


# 4.x files

def test_4_1_instruction_md_must_exist_and_hold_text(tmp_path):
    make_task(tmp_path, "missing", instruction=None)
    assert refused([tmp_path / "missing"]).startswith("task missing: instruction.md is missing; add ")
    make_task(tmp_path, "blank", instruction="  \n\n")
    assert refused([tmp_path / "blank"]) == "task blank: instruction.md is empty; write the agent's instruction in it"
    path = make_task(tmp_path, "binary")
    (path / "instruction.md").write_bytes(b"\xff\xfe")
    assert refused([path]).startswith("task binary: instruction.md is not UTF-8")


def test_4_2_tests_test_sh_must_exist(tmp_path):
    make_task(tmp_path, "none", test_sh=False)
    make_task(tmp_path, "other", test_sh=False, files={"tests/test_x.py": ""})
    for name in ("none", "other"):
        text = refused([tmp_path / name])
        assert text.startswith(f"task {name}: tests/test.sh is missing; add the verifier script ")


def test_4_3_solution_and_agent_are_optional(tmp_path):
    bare = load_tasks([make_task(tmp_path, "bare")])[0]
    assert (bare.solution_dir, bare.agent_dir) == (None, None)
    no_script = load_tasks([make_task(tmp_path, "no-script", files={"solution/notes.md": ""})])[0]
    assert no_script.solution_dir is None  # solution/ counts only with its solve.sh


# 5.x the start state

def test_5_1_no_environment_is_an_empty_start_state(tmp_path):
    assert load_tasks([make_task(tmp_path, "t1", workdir=False)])[0].workdir is None


def test_5_2_an_empty_environment_is_an_empty_start_state(tmp_path):
    path = make_task(tmp_path, "t1", workdir=False)
    (path / "environment").mkdir()
    (path / "environment" / ".gitkeep").write_text("")
    assert load_tasks([path])[0].workdir is None


@pytest.mark.parametrize("image_file,what", [
    ("Dockerfile", "a Dockerfile"),
    ("app.Dockerfile", "a Dockerfile"),
    ("docker-compose.yaml", "a compose file"),
    ("compose.yml", "a compose file"),
])
def test_5_3_an_image_only_environment_is_an_image_task(tmp_path, image_file, what):
    path = make_task(tmp_path, "t1", workdir=False, files={f"environment/{image_file}": "FROM scratch\n"})
    [task] = load_tasks([path])
    assert task.image_task and task.workdir is None and task.docker_image is None


def test_5_3b_docker_image_makes_an_image_task_and_harbor_keys_are_read(tmp_path):
    toml = ('[environment]\ndocker_image = " python:3.12-slim "\nstorage_mb = 512\nbuild_timeout_sec = 90\n'
            'allow_internet = false\n[environment.env]\nGREETING = "Hi"\n')
    path = make_task(tmp_path, "t1", toml, workdir=False)
    [task] = load_tasks([path])
    assert (task.image_task, task.docker_image, task.storage_mb, task.build_timeout_sec, task.allow_internet,
            task.env) == (True, "python:3.12-slim", 512, 90.0, False, {"GREETING": "Hi"})
    assert "environment" not in task.extra
    [plain] = load_tasks([make_task(tmp_path, "t2")])
    assert not plain.image_task and plain.env == {} and plain.allow_internet is None


@pytest.mark.parametrize("body,problem", [
    ("docker_image = 3", "docker_image = 3 is not an image reference"),
    ("docker_image = \"\"", "docker_image = '' is not an image reference"),
    ("env = {A = 1}", "env is not a table of NAME = \"string\" entries"),
    ("env = {\"1A\" = \"x\"}", "env is not a table of NAME = \"string\" entries"),
    ("allow_internet = \"yes\"", "allow_internet = 'yes' is not true or false"),
    ("storage_mb = 1.5", "storage_mb = 1.5 is not a positive whole number"),
    ("build_timeout_sec = 0", "build_timeout_sec = 0 is not a positive number of seconds"),
])
def test_5_3c_bad_harbor_environment_keys_are_refused_in_one_line(tmp_path, body, problem):
    path = make_task(tmp_path, "t1", f"[environment]\n{body}\n")
    assert refused([path]).startswith(f"task t1: task.toml [environment] {problem}"), refused([path])


def test_5_4_a_dockerfile_beside_workdir_is_fine(tmp_path):
    path = make_task(tmp_path, "t1", files={"environment/Dockerfile": "FROM scratch\n"})
    assert load_tasks([path])[0].workdir == path / "environment" / "workdir"


def test_5_5_other_files_in_environment_without_workdir_are_refused(tmp_path):
    path = make_task(tmp_path, "t1", workdir=False, files={"environment/app.py": "", "environment/data.csv": ""})
    assert refused([path]) == ("task t1: environment/ holds app.py, data.csv but no workdir/ and no Dockerfile "
                               "(nothing there reaches the sandbox); move the start state into environment/workdir/, "
                               "or add the Dockerfile that uses it")


def test_5_6_workdir_and_environment_must_be_directories(tmp_path):
    path = make_task(tmp_path, "a", workdir=False, files={"environment/workdir": "a file"})
    assert refused([path]).startswith("task a: environment/workdir is not a directory;")
    path = make_task(tmp_path, "b", workdir=False, files={"environment": "a file"})
    assert refused([path]).startswith("task b: environment is not a directory;")


# 6.x the contract

def test_6_1_tasks_are_frozen_and_hashable(tmp_path):
    task = load_tasks([make_task(tmp_path, "t1", FULL_TOML)])[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.id = "other"  # type: ignore[misc]
    assert {task: 1}[task] == 1 and task == load_task(tmp_path / "t1")


def test_6_2_task_error_is_a_value_error():
    assert issubclass(TaskError, ValueError)


def test_6_3_a_single_path_may_be_given_bare(tmp_path):
    make_task(tmp_path, "t1")
    assert [t.id for t in load_tasks(tmp_path / "t1")] == ["t1"]  # type: ignore[arg-type]
