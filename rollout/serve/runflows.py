"""A served run's flow records (polar-rollout serve). The serve's one proxy writes every run's sessions into one flow
directory, and keeps writing while a run's records are processed. Before processing, RUN/flows/ gets a hard link to
each file of that directory written since the run began:

- polar-process reads only those: a file last written before the run began holds none of its sessions, so a run's
  processing does not grow with the serve's age (at most the proxy's open file, rotated at polar_rotate_mb, plus the
  files closed during the run); --session-prefix keeps the run's own sessions out of what else they hold.
- A link keeps its name when the proxy renames the file (`.open` → closed, at rotation or when it stops), so a
  rename in the middle of polar-process cannot pull a file from under it. A link shares the file: records the proxy
  appends later appear in it too, and a reader takes whole records only (polar.records: a torn tail of an open file
  is a record in progress).
- One link per file (by inode): a file renamed since an earlier link of the same RUN (a resumed run) is not linked
  twice, which would read its records twice.
Where a link cannot be made (RUN on another filesystem), polar-process is given the serve's files themselves."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from polar import records as rec

SLACK_S = 5.0  # a file last written this long before the run began is linked too (mtime granularity, clock steps)
LIST_TRIES = 3  # a file renamed between the listing and its link: list again


def _inodes(directory: Path) -> set[tuple[int, int]]:
    out = set()
    for p in directory.iterdir():
        try:
            st = p.stat()
        except OSError:
            continue
        out.add((st.st_dev, st.st_ino))
    return out


def _recent(flows: str, since: float) -> list[tuple[str, os.stat_result]]:
    """(path, stat) of every flow file of `flows` last written at or after `since` - SLACK_S."""
    out = []
    for path in rec.expand_inputs([flows]) if os.path.isdir(flows) else []:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue  # renamed since the listing: the next listing has it under its new name
        if st.st_mtime >= since - SLACK_S:
            out.append((path, st))
    return out


def link_flows(flows: str, run_flows: Path, since: float) -> list[str]:
    """Link into `run_flows` the files of `flows` written since `since` (see the module docstring); the inputs
    polar-process is given: [run_flows], or the files themselves where links cannot be made."""
    run_flows.mkdir(parents=True, exist_ok=True)
    have = _inodes(run_flows)
    for _ in range(LIST_TRIES):
        missed = False
        for path, st in _recent(flows, since):
            if (st.st_dev, st.st_ino) in have:
                continue
            try:
                os.link(path, run_flows / os.path.basename(path))
            except FileNotFoundError:
                missed = True
                continue
            except FileExistsError:
                continue
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                return _unlinked(flows, run_flows, since, have)
            have.add((st.st_dev, st.st_ino))
        if not missed:
            break
    return [str(run_flows)]


def _unlinked(flows: str, run_flows: Path, since: float, have: set[tuple[int, int]]) -> list[str]:
    """No links here: RUN/flows's own files (a resumed run's), then the serve's recent files not among them."""
    own = [str(run_flows)] if any(run_flows.iterdir()) else []
    return own + [path for path, st in _recent(flows, since) if (st.st_dev, st.st_ino) not in have]
