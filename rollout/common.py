"""What every rollout module shares: the run's identities (session, group, the reserved preflight task), the one
error a run reports as a line (`UsageError`), the cancel flag, and JSON files written whole."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from polar.records.files import write_json_atomic

VERSION = 1
PREFLIGHT = "preflight"  # sessions <run-id>/preflight/0 (canary call) and /1 (canary sample); a reserved task id

CANCEL = threading.Event()  # set on Ctrl-C / SIGTERM: running samples end as `cancelled`, no new one starts


class UsageError(Exception):
    """Bad input, or a preflight that refused: one line, exit 2."""


class Cancelled(Exception):
    pass


def now() -> float:
    return time.time()


def write_json(path: Path, doc: Any) -> None:
    write_json_atomic(path, doc, default=str)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def session_of(run_id: str, task: str, k: int, attempt: int) -> str:
    return f"{run_id}/{task}/{k}/{attempt}"


def group_of(run_id: str, task: str) -> str:
    return f"{run_id}/{task}"


def proxy_url(port: int, session: str) -> str:
    return f"http://{quote(session, safe='')}:x@127.0.0.1:{port}"


def tail(path: Path, n: int = 800) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - n))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def lock_dir(directory: Path, held: str) -> int:
    """An exclusive lock on `directory`/.lock, held while the returned descriptor is open; UsageError(`held`) when
    another process holds it."""
    fd = os.open(Path(directory) / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UsageError(held) from None
    return fd
