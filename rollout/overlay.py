"""A sample's writable working directory as an overlay mount over the start state (issue 39), instead of a copy.

Why the kernel's overlayfs, mounted by the runner: bwrap here is 0.8.0 (its --overlay came in 0.10), and docker's
own layers cover an image's root but not a directory we hand it. A copy of a repository-sized WORKDIR (20,000
files, 200 MB) costs seconds a sample; an overlay costs a mount (scripts/bench_workdir measures both).

- The start state (the image's exported WORKDIR, or environment/workdir/) is the lower layer, read-only and shared;
  each sample's upper layer and overlay work directory live in its own work directory (`<work>/.overlay/`), and the
  merged view is mounted at `<work>/app`, which the sandboxes bind as before. The verifier's view stacks the
  agent's upper layer (unmounted first) on the start state under an upper layer of its own.
- mount(2) needs root (CAP_SYS_ADMIN): `why_no_overlay()` says why not; the runner then copies as before and says so
  once per run.
- After a crash a mount outlives its run. `sweep()` (each run, at its start) unmounts the overlays under
  `<RUN>/.work/` of every run that is no longer running (its RUN/.lock is free; the run's own, which it holds, all
  of them) and removes their directories.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import shutil
import tempfile
import threading
from pathlib import Path

from polar.rollout.sandbox.view import chown_tree

MNT_DETACH = 2
LAYERS = ".overlay"  # <work>/.overlay/{upper,work,...}: a sample's layers, beside its merged view
WORK_DIR = ".work"  # RUN/.work/<sample>/: a sample's work directory (polar.rollout.job.job_paths)
_libc = ctypes.CDLL(None, use_errno=True)


class OverlayError(OSError):
    """The overlay could not be mounted or unmounted."""


def _mount(lowers: list[Path], upper: Path, work: Path, merged: Path) -> None:
    lower = ":".join(str(p) for p in lowers)
    if any(c in str(p) for p in (*lowers, upper, work) for c in ",:\\"):
        raise OverlayError(f"an overlay layer's path has a ',', ':' or '\\': {lower} {upper}")
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"overlay", str(merged).encode(), b"overlay", 0, opts) != 0:
        err = ctypes.get_errno()
        raise OverlayError(err, f"mount overlay on {merged}: {os.strerror(err)}")


def unmount(merged: Path) -> None:
    """Unmount an overlay (lazily: a process still inside cannot keep it)."""
    if _libc.umount2(str(merged).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OverlayError(err, f"umount {merged}: {os.strerror(err)}")


@functools.lru_cache(maxsize=None)
def why_no_overlay(where: str) -> str | None:
    """None when an overlay mounts under `where` (tried once per directory), else why not (one line)."""
    if os.geteuid() != 0:
        return "mounting an overlay needs root"
    try:
        with open("/proc/filesystems") as fh:
            if not any(line.split()[-1:] == ["overlay"] for line in fh):
                return "the kernel has no overlay filesystem"
    except OSError as exc:
        return f"/proc/filesystems: {exc.strerror}"
    Path(where).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".overlay-probe-", dir=where) as tmp:
        t = Path(tmp)
        for d in ("lower", "upper", "work", "merged"):
            (t / d).mkdir()
        try:
            _mount([t / "lower"], t / "upper", t / "work", t / "merged")
        except OverlayError as exc:
            return str(exc)
        unmount(t / "merged")
    return None


def mount_view(lowers: list[Path], work: Path, name: str = "app") -> Path:
    """`<work>/<name>`: an overlay of `lowers` (first on top) under a fresh upper layer `<work>/.overlay/<name>`."""
    layers = work / LAYERS / name
    upper, scratch, merged = layers / "upper", layers / "work", work / name
    for d in (upper, scratch, merged):
        d.mkdir(parents=True)
    _mount(lowers, upper, scratch, merged)
    return merged


_owned: set[tuple[str, tuple[int, int], bool]] = set()  # trees handed over by this process (own_tree)
_owned_lock = threading.Lock()


def own_tree(root: Path, owner: tuple[int, int] | None, dirs_only: bool = False) -> None:
    """A lower layer handed to the sandbox's uid, on the host, once per process (the runner's samples share it;
    nothing else writes it): through an overlay a chown is a copy-up, so the lower layer must already be the
    agent's. A start state is handed over whole, so each sample's view is the agent's below its root
    (SandboxSpec.app_owned); an image's exported root only its directories (`dirs_only`, rootfs_view)."""
    if owner is None:
        return
    key = (str(root), owner, dirs_only)
    with _owned_lock:
        if key in _owned:
            return
        chown_tree(root, *owner, dirs_only=dirs_only)
        _owned.add(key)


ROOT_VIEW = "root"  # <work>/root: a sample's writable view of its image's exported root (bwrap)


def rootfs_view(rootfs: Path, work: Path, owner: tuple[int, int] | None) -> Path:
    """`<work>/root`: the image's exported root under an upper layer of the sample's own, for a sandbox that binds
    it at / (bwrap). Its directories are handed to the sandbox's uid first (once per process), as a container's are
    (rollout/sandbox/docker.py): the agent creates, replaces and removes files in any directory below / — `pip
    install` into the image's site-packages, a tool in /usr/local/bin — while a file the image's root owns is not
    written in place. Everything goes with the sample's work directory; the verifier binds the export again."""
    own_tree(rootfs, owner, dirs_only=True)
    return mount_view([rootfs], work, ROOT_VIEW)


def is_view(path: Path) -> bool:
    """Whether `path` is an overlay mounted here (a sample's view)."""
    return str(path) in {point for point, _ in _overlay_mounts()}


def upper_of(work: Path, name: str = "app") -> Path:
    return work / LAYERS / name / "upper"


def _overlay_mounts() -> list[tuple[str, str]]:
    """(mount point, super options) of each overlay mount in this mount namespace."""
    out = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                fields, rest = left.split(), right.split()
                if len(fields) > 4 and len(rest) >= 3 and rest[0] == "overlay":
                    out.append((_unescape(fields[4]), rest[2]))
    except OSError:
        pass
    return out


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def _run_of(point: str) -> Path | None:
    """The RUN directory of a mount point `<RUN>/.work/<sample>/<name>`, else None (not a sample's view)."""
    p = Path(point)
    if len(p.parts) >= 4 and p.parent.parent.name == WORK_DIR and (p.parent / LAYERS).is_dir():
        return p.parent.parent.parent
    return None


def _running(run: Path) -> bool:
    """Whether another process holds RUN/.lock (the run is alive)."""
    try:
        fd = os.open(run / ".lock", os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def sweep(own_run: Path | None = None) -> list[str]:
    """Unmount the sample views left by runs that are not running (and every one under `own_run`, whose lock this
    process holds), removing their sample work directories; the mount points swept."""
    swept = []
    own = own_run.resolve() if own_run is not None else None
    for point, _ in sorted(_overlay_mounts(), key=lambda m: len(m[0]), reverse=True):
        run = _run_of(point)
        if run is None or (run.resolve() != own and _running(run)):
            continue
        with contextlib.suppress(OverlayError):
            unmount(Path(point))
            swept.append(point)
            shutil.rmtree(Path(point).parent, ignore_errors=True)
    return swept


def remove_work(work: Path) -> None:
    """A sample's work directory removed, its overlays unmounted first (rmtree would empty a mounted view)."""
    mounted = {point for point, _ in _overlay_mounts()}
    for child in (work.iterdir() if work.is_dir() else ()):
        if str(child) in mounted:
            unmount(child)
    shutil.rmtree(work, ignore_errors=True)
