"""polar.launch.process with real child processes: the one "alive and ours" rule (a dead, a zombie and a recycled
pid are not ours), ports, stopping a process group (SIGTERM, SIGKILL for one that ignores it, a worker that
outlives its leader), and a child tied to its starter (it ends with the starting thread, or a SIGKILLed starter)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from polar.launch import process

pytestmark = pytest.mark.unit

# A fork reaches exec in milliseconds; ten seconds is only reached by a machine too loaded to run the suite.
EXEC_WAIT_S = 10


def _zombie() -> subprocess.Popen:
    """A child that has exited and is not reaped yet."""
    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return proc
        time.sleep(0.01)
    raise AssertionError("the child never became a zombie")


def test_1_1_a_live_child_is_ours_only_by_its_marker():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "polar-test-marker"])
    try:
        assert process.alive(child.pid)
        deadline = time.monotonic() + EXEC_WAIT_S  # until the fork has exec'd, /proc shows pytest's command line
        while b"polar-test-marker" not in Path(f"/proc/{child.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.01)
        assert process.is_ours(child.pid, "polar-test-marker")
        assert not process.is_ours(child.pid, process.PROXY_MARKER)  # alive, but someone else's
    finally:
        child.kill()
        child.wait()
    assert not process.alive(child.pid) and not process.is_ours(child.pid, "polar-test-marker")


def test_1_2_a_zombie_is_dead_and_not_ours():
    proc = _zombie()
    try:
        assert not process.alive(proc.pid)
        assert not process.is_ours(proc.pid, "true")
    finally:
        proc.wait()


@pytest.mark.parametrize("pid", [None, 0, -1, True, "123", 1.5])
def test_1_3_what_is_not_a_pid_is_not_alive(pid):
    assert not process.alive(pid) and not process.is_ours(pid, "x")


def test_2_1_free_port_and_port_in_use():
    port = process.free_port()
    assert not process.port_in_use(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert process.port_in_use(port)
    assert not process.port_in_use(port)


def _group(script: str) -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", script], start_new_session=True)


def test_3_1_kill_group_stops_a_group_with_sigterm():
    leader = _group("sleep 30")
    assert process.kill_group(leader.pid, timeout=10) is False  # SIGTERM was enough: no SIGKILL was sent
    assert not process.group_alive(leader.pid) and leader.poll() is not None


def test_3_2_a_group_that_ignores_sigterm_gets_sigkill_and_a_log_line():
    leader = _group("trap '' TERM; while :; do sleep 0.05; done")
    time.sleep(0.3)  # the trap is set
    lines: list[str] = []
    assert process.kill_group(leader.pid, timeout=0.5, log=lines.append) is True
    assert leader.wait(timeout=10) is not None
    assert len(lines) == 1 and "SIGKILL" in lines[0] and str(leader.pid) in lines[0]


def test_3_3_a_worker_outliving_its_leader_keeps_the_group_alive():
    leader = _group("sleep 30 & echo $! ; exit 0")
    leader.wait(timeout=10)  # the leader is gone and reaped; its worker still runs in the group
    try:
        assert process.group_alive(leader.pid)
        assert process.stop_groups([leader.pid], timeout=10) == []
        assert not process.group_alive(leader.pid)
    finally:
        try:
            os.killpg(leader.pid, 9)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------------------------ 4. tied children

def _started_from_a_thread(preexec) -> subprocess.Popen:
    box: list[subprocess.Popen] = []
    starter = threading.Thread(target=lambda: box.append(subprocess.Popen(["sleep", "600"], preexec_fn=preexec)))
    starter.start()
    starter.join()  # the starting thread has ended
    return box[0]


def test_4_1_a_tied_child_ends_with_the_thread_that_started_it_an_untied_one_does_not():
    untied = _started_from_a_thread(None)  # its starter ended first: had it a death signal, it came first
    tied = _started_from_a_thread(process.ending_with_this_thread())
    try:
        assert tied.wait(timeout=10) == -signal.SIGTERM
        assert untied.poll() is None
    finally:
        for proc in (tied, untied):
            proc.kill()
            proc.wait()


def test_4_2_a_sigkilled_starter_leaves_no_tied_child():
    code = ("import subprocess, sys, time; from polar.launch import process\n"
            "p = subprocess.Popen(['sleep', '600'], preexec_fn=process.ending_with_this_thread())\n"
            "print(p.pid, flush=True); time.sleep(600)")
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(starter.stdout.readline())
    assert process.alive(child)
    starter.kill()
    starter.wait()
    deadline = time.monotonic() + 10
    while process.alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not process.alive(child)
    finally:
        if process.alive(child):
            os.kill(child, signal.SIGKILL)
