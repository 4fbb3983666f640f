"""Process identity and the OS chores the services share: whether a pid is alive and one of ours, loopback ports,
stopping a process group, a child that ends with its starter.

One rule for "ours": the pid is alive (a zombie is not) and its command line contains the caller's marker (the
proxy: `polar_addon.py`; vLLM: its launcher's file name). Without /proc a live pid is trusted. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable

PROXY_MARKER = "polar_addon.py"  # every proxy's command line names the addon script


def alive(pid: object) -> bool:
    """Whether process `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (not Linux): the signal said it exists


def is_ours(pid: object, marker: str) -> bool:
    """True when `pid` is alive and its command line contains `marker`: a recycled pid or a zombie is not ours."""
    if not alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return marker.encode() in fh.read()
    except OSError:
        return not os.path.isdir("/proc")  # gone in between (False), or no /proc at all: trust the live pid


def group_alive(pgid: int) -> bool:
    """Whether a live process of group `pgid` remains; zombies do not count (an orphan's may wait a while for a
    reaper that never comes, e.g. a container's init)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if alive(pgid) or not os.path.isdir("/proc"):
        return True
    for entry in os.listdir("/proc"):  # the leader is gone: does another member (a worker) still run?
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether binding `port` fails; SO_REUSEADDR as servers bind, so a stopped server's TIME_WAIT does not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def ending_with_this_thread(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child is sent `sig` when the thread that starts it ends, the process
    SIGKILLed included (Linux's PR_SET_PDEATHSIG; a child started from the main thread lives as long as the
    process). A child of a parent already gone by then gets `sig` at once. None where prctl is not available.
    libc is loaded here, before the fork: the child only calls it."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the starter died between fork and the request above
            os.kill(os.getpid(), sig)

    return preexec


def _reap(pid: int) -> None:
    # Our own child leaves a zombie that keeps its group "alive"; anyone else's is reaped by its parent.
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


def stop_groups(pgids: Iterable[int], timeout: float = 5.0, poll: float = 0.05) -> list[int]:
    """SIGTERM every group at once (they shut down side by side), wait up to `timeout` s for all of them, SIGKILL
    what is left. Returns the groups that needed SIGKILL."""
    pending = []
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGTERM)
            pending.append(pgid)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for pgid in pending:
            _reap(pgid)
        pending = [p for p in pending if group_alive(p)]
        if pending:
            time.sleep(poll)
    killed = []
    for pgid in pending:
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        except (ProcessLookupError, PermissionError):
            pass
        _reap(pgid)
    return killed


def kill_group(pgid: int, timeout: float = 5.0, log: Callable[[str], None] | None = None) -> bool:
    """SIGTERM the process group led by `pgid`, SIGKILL after `timeout` s; True when SIGKILL was needed (then `log`
    gets one line saying so)."""
    killed = bool(stop_groups([pgid], timeout))
    if killed and log is not None:
        log(f"process group {pgid} still alive after {timeout:.0f} s; sent SIGKILL")
    return killed
