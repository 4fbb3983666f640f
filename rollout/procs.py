"""Process control for a run: whether a proxy pid is ours and alive, stopping a process group, ending every sample's
sandbox at once (Ctrl-C), closing a dead writer's flow files."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Iterable

from polar import records as rec
from polar.launch import process

is_alive = process.alive  # a zombie is not alive


def is_our_proxy(pid: int | None) -> bool:
    return process.is_ours(pid, process.PROXY_MARKER)


def stop_process_group(pid: int, grace: float = 5.0) -> None:
    """SIGTERM the process group led by `pid` (a proxy: it closes and renames its flow files), SIGKILL after `grace`."""
    process.kill_group(pid, grace)


def kill_children(spare: Iterable[int] = ()) -> None:
    """SIGKILL the process group of every child of this process but `spare`: each sandbox is a session of its own
    (the sandbox module starts them with start_new_session), so this ends every running sample at once. The
    runner's own proxy is a child too, spared: it must close its flow files on a clean stop."""
    me, spare = os.getpid(), set(spare)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and int(entry) not in spare:
            pid = int(entry)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)


def close_dead_writers(flows: Path) -> list[str]:
    """Close the `.open` files of writers that are gone (this host, pid not a live proxy): cut back to their last
    whole record and renamed to `.msgpack` (`polar.records.close_dead_writers`). Returns their names."""
    return rec.close_dead_writers(str(flows), alive=is_our_proxy)
