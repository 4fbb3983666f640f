"""rotate-logs: every test runs `bash rotate.sh` and fails on the start state's stub (exit 1, no output)."""

import os
import subprocess

import pytest


@pytest.fixture
def rotate(app, tmp_path):
    """Runs the agent's script; every test fails when the script calls Python (the task says bash only)."""
    script = app / "rotate.sh"
    assert "python" not in script.read_text(encoding="utf-8", errors="replace").lower(), "rotate.sh calls Python"

    def run(*args):
        return subprocess.run(["bash", str(script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=20)
    return run


@pytest.fixture
def logs(tmp_path):
    """DIR with five logs modified a minute apart, oldest first: c.log, "a b.log", e.log, b.log, d.log."""
    directory = tmp_path / "logs"
    directory.mkdir()
    for age, name in enumerate(["c.log", "a b.log", "e.log", "b.log", "d.log"]):
        path = directory / name
        path.write_text(name)
        os.utime(path, (1_700_000_000 + age * 60,) * 2)
    return directory


def _names(directory):
    return sorted(p.name for p in directory.iterdir() if p.is_file())


def test_keeps_the_newest(rotate, logs):
    done = rotate(str(logs), "2")
    assert done.returncode == 0, done.stderr
    assert _names(logs) == ["b.log", "d.log"]
    assert _names(logs / "archive") == ["a b.log", "c.log", "e.log"]


def test_prints_what_it_archived_oldest_first(rotate, logs):
    done = rotate(str(logs), "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["archived c.log", "archived a b.log"]


def test_keep_zero_archives_every_log(rotate, logs):
    done = rotate(str(logs), "0")
    assert done.returncode == 0, done.stderr
    assert _names(logs) == [] and len(_names(logs / "archive")) == 5


def test_other_files_and_subdirectories_left_alone(rotate, logs):
    (logs / "notes.txt").write_text("keep me")
    (logs / "sub").mkdir()
    (logs / "sub" / "old.log").write_text("old")
    os.utime(logs / "sub" / "old.log", (1_600_000_000,) * 2)
    done = rotate(str(logs), "1")
    assert done.returncode == 0, done.stderr
    assert _names(logs) == ["d.log", "notes.txt"]
    assert (logs / "sub" / "old.log").exists()


def test_runs_again_over_an_existing_archive(rotate, logs):
    assert rotate(str(logs), "4").returncode == 0
    (logs / "c.log").write_text("new c")
    os.utime(logs / "c.log", (1_600_000_000,) * 2)
    done = rotate(str(logs), "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "archived c.log\n"
    assert (logs / "archive" / "c.log").read_text() == "new c"


def test_usage_errors_exit_2(rotate, logs):
    for args in ([], [str(logs)], [str(logs), "two"], [str(logs), "-1"], [str(logs), "1", "extra"]):
        done = rotate(*args)
        assert done.returncode == 2 and done.stderr and done.stdout == "", args


def test_missing_directory_exits_1(rotate, tmp_path):
    done = rotate(str(tmp_path / "nowhere"), "1")
    assert done.returncode == 1 and "nowhere" in done.stderr and done.stdout == ""
