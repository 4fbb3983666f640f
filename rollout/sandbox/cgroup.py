"""A sandbox's memory (and CPU) limit on the host: a cgroup under the caller's own (v1, one per controller, or v2)
when one is writable, else `prlimit --as`; docker sets its own (--memory, swap included)."""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path


def _mounts_of(fstype: str) -> list[tuple[str, str, set[str]]]:
    """(mount root, mount point, super options) of each mount of `fstype`."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if len(rfields) >= 3 and rfields[0] == fstype:
                    out.append((fields[3], fields[4], set(rfields[2].split(","))))
    except OSError:
        pass
    return out


def _own_cgroup(controller: str) -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if (controller == "" and ctrls == "") or (controller and controller in ctrls.split(",")):
                    return path
    except OSError:
        pass
    return None


def _join(mount: str, root: str, own: str) -> Path | None:
    if root != "/" and not (own == root or own.startswith(root.rstrip("/") + "/")):
        return None
    rel = own[len(root):] if root != "/" else own
    return Path(mount + "/" + rel.lstrip("/"))


class _Cgroup:
    """A cgroup (or one per v1 controller) for one sandbox, under the caller's own."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        self.procs: list[str] = []
        self.version = ""

    @classmethod
    def create(cls, memory_mb: int | None, cpus: float | None) -> _Cgroup | None:
        name = f"polar-sbx-{uuid.uuid4().hex[:12]}"
        cg = cls()
        try:
            if memory_mb is not None and cg._v1(name, memory_mb, cpus):
                return cg
            cg.remove()
            cg = cls()
            if memory_mb is not None and cg._v2(name, memory_mb, cpus):
                return cg
        except OSError:
            pass
        cg.remove()
        return None

    def _mkdir(self, parent: Path | None, name: str) -> Path | None:
        if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK):
            return None
        d = parent / name
        d.mkdir()
        self.dirs.append(d)
        return d

    def _v1(self, name: str, memory_mb: int, cpus: float | None) -> bool:
        mounts = {}
        for root, point, opts in _mounts_of("cgroup"):
            for c in ("memory", "cpu"):
                if c in opts and c not in mounts:
                    mounts[c] = (root, point)
        if "memory" not in mounts:
            return False
        own = _own_cgroup("memory")
        d = self._mkdir(_join(mounts["memory"][1], mounts["memory"][0], own) if own else None, name)
        if d is None:
            return False
        limit = memory_mb * 1024 * 1024
        (d / "memory.limit_in_bytes").write_text(str(limit))
        if (d / "memory.memsw.limit_in_bytes").exists():  # swap counted in the limit
            try:
                (d / "memory.memsw.limit_in_bytes").write_text(str(limit))
            except OSError:
                pass
        self.procs.append(str(d / "cgroup.procs"))
        self.version = "cgroup v1"
        if cpus and "cpu" in mounts:
            own_cpu = _own_cgroup("cpu")
            try:
                c = self._mkdir(_join(mounts["cpu"][1], mounts["cpu"][0], own_cpu) if own_cpu else None, name)
                if c is not None:
                    (c / "cpu.cfs_period_us").write_text("100000")
                    (c / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpus * 100000))))
                    self.procs.append(str(c / "cgroup.procs"))
            except OSError:
                pass  # the CPU quota is best effort; memory is what is reported
        return True

    def _v2(self, name: str, memory_mb: int, cpus: float | None) -> bool:
        mounts = _mounts_of("cgroup2")
        own = _own_cgroup("")
        if not mounts or own is None:
            return False
        root, point, _ = mounts[0]
        parent = _join(point, root, own)
        if parent is None or not (parent / "cgroup.controllers").is_file():
            return False
        if "memory" not in (parent / "cgroup.controllers").read_text().split():
            return False
        if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            (parent / "cgroup.subtree_control").write_text("+memory")  # EBUSY when the parent holds processes
        d = self._mkdir(parent, name)
        if d is None:
            return False
        (d / "memory.max").write_text(str(memory_mb * 1024 * 1024))
        if (d / "memory.swap.max").exists():
            (d / "memory.swap.max").write_text("0")
        if cpus and (d / "cpu.max").exists():
            try:
                (d / "cpu.max").write_text(f"{max(1000, int(cpus * 100000))} 100000")
            except OSError:
                pass
        self.procs.append(str(d / "cgroup.procs"))
        self.version = "cgroup v2"
        return True

    def prefix(self) -> list[str]:
        """argv prefix putting the command (and so everything it starts) into the cgroup before it runs."""
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "polar-cgroup", *self.procs, "--"]

    def kill_all(self) -> None:
        for procs in self.procs:
            try:
                pids = [int(x) for x in Path(procs).read_text().split()]
            except (OSError, ValueError):
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def remove(self) -> None:
        for d in reversed(self.dirs):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill_all()
                    time.sleep(0.05)
        self.dirs.clear()


def limit_memory(memory_mb: int | None, cpus: float | None) -> tuple[list[str], _Cgroup | None, str]:
    """(argv prefix, the cgroup or None, the limit in force as SandboxResult.memory_limit words) for a sandbox that
    does not limit itself (bwrap, none): a cgroup when one is writable, else prlimit --as."""
    if memory_mb is None:
        return [], None, "none"
    cg = _Cgroup.create(memory_mb, cpus)
    if cg is not None:
        return cg.prefix(), cg, f"{cg.version} memory {memory_mb} MiB"
    prlimit = shutil.which("prlimit")
    if prlimit:
        return [prlimit, f"--as={memory_mb * 1024 * 1024}"], None, f"prlimit --as {memory_mb} MiB"
    return [], None, "none (no writable cgroup, no prlimit)"
