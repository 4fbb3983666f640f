"""A sample's private control directory on the host (bound read-only at /run/polar in a sandbox): OWNER_FILE (the
pid and start time of the process that made it), the wrapper (relay.py), the agent's environment, the ready FIFO
and, with a proxy, the relay's socket. `sweep_stale_controls` removes the directories of dead runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

from polar.records.files import write_json_atomic
from polar.rollout.sandbox.relay import HostRelay, proxy_user

CONTROL = "/run/polar"
CONTROL_PREFIX = "polar-sbx-"
OWNER_FILE = "owner.json"
SANDBOX_VAR = "POLAR_SANDBOX_DIR"  # --sandbox none: the agent's control directory, in its environment
_RELAY_SOURCE = Path(__file__).with_name("relay.py")


def _control_base() -> str:
    base = tempfile.gettempdir()
    return "/tmp" if len(base) > 60 else base  # the relay's socket path must stay under the 107-byte limit


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, it names one process (pids are reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return None if fields[0] == b"Z" else int(fields[19])  # a zombie is gone
    except (OSError, ValueError, IndexError):
        return None


class ControlDir:
    """The sample's private control directory on the host, bound read-only at /run/polar. Its OWNER_FILE names the
    process that made it (pid and start time), so `sweep_stale_controls` can tell a dead run's directory. `env` is
    the agent's environment as the wrapper sets it (a sandbox that is not `isolated` gets SANDBOX_VAR here)."""

    def __init__(self, spec, owner: tuple[int, int] | None, env: dict[str, str], isolated: bool = True):
        self.isolated = isolated
        self.dir = Path(tempfile.mkdtemp(prefix=CONTROL_PREFIX, dir=_control_base()))
        self.relay: HostRelay | None = None
        self.ready_fd: int | None = None
        try:
            # first, written whole (rename): a directory without it is never swept (it may be a live one's, just made)
            write_json_atomic(self.dir / OWNER_FILE, {"pid": os.getpid(), "start": _start_ticks(os.getpid()),
                                                      "kind": spec.kind, "session": spec.session,
                                                      "created": time.time()}, indent=None)
            # mkdtemp made it 0700: it opens (0755) only once every file in it has its owner and mode
            shutil.copyfile(_RELAY_SOURCE, self.dir / "relay.py")
            os.chmod(self.dir / "relay.py", 0o644)
            for rel, source in getattr(spec, "control_files", ()):  # e.g. an agent's modules, in image mode
                target = self.dir / rel
                target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
                shutil.copyfile(source, target)
                os.chmod(target, 0o644)
            for m in getattr(spec, "mounts", ()):  # a mount at /run/polar/NAME needs its mount point here
                rest = m.inside[len(CONTROL) + 1:] if m.inside.startswith(CONTROL + "/") else ""
                if rest and "/" not in rest:
                    (self.dir / rest).mkdir(exist_ok=True)
                    os.chmod(self.dir / rest, 0o755)
            env = dict(env)
            if not isolated:  # on the host, the sweep finds what a dead run's agent left by this variable
                env[SANDBOX_VAR] = str(self.dir)
            payload = {"env": env, "proxy_user": proxy_user(spec.session) if spec.session else None,
                       "all_proxies": bool(getattr(spec, "tripwire", False))}
            fd = os.open(self.dir / "env.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(payload, f)
            # write-only even for its owner (the agent's uid; the mount is read-only, so no chmod): an agent that
            # could read the FIFO could swallow the wrapper's line and pass its own failure off as the sandbox's
            os.mkfifo(self.dir / "ready", 0o600)
            if owner is not None:
                for name in ("env.json", "ready"):
                    os.chown(self.dir / name, *owner)
            self.ready_fd = os.open(self.dir / "ready", os.O_RDONLY | os.O_NONBLOCK)  # before the chmod
            os.chmod(self.dir / "ready", 0o200)
            if spec.proxy_port is not None:
                self.relay = HostRelay(str(self.dir / "proxy.sock"), spec.proxy_port, spec.session or "", owner=owner)
            elif getattr(spec, "tripwire", False):
                self.relay = HostRelay(str(self.dir / "proxy.sock"), 0, "tripwire", owner=owner,
                                       refuse="this sandbox has no network")
            os.chmod(self.dir, 0o755)
        except BaseException:
            self.close()
            raise

    def inside(self, name: str) -> str:
        """Where the sandbox sees the file `name` of this directory (its host path when the agent is on the host)."""
        return f"{CONTROL}/{name}" if self.isolated else str(self.dir / name)

    def ready(self) -> str:
        if self.ready_fd is None:
            return ""
        try:
            return os.read(self.ready_fd, 4096).decode(errors="replace")
        except BlockingIOError:
            return ""

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.ready_fd is not None:
            os.close(self.ready_fd)
            self.ready_fd = None
        shutil.rmtree(self.dir, ignore_errors=True)


def _owner_doc(d: Path) -> dict | None:
    """The OWNER_FILE of a control directory this uid made, else None (not ours, not one, or not written yet)."""
    try:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return None
        doc = json.loads((d / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("pid"), int) else None


def _kill_left_behind(ctl: str) -> int:
    """SIGKILL what a dead run's `none` sandbox left: its wrapper (argv names ctl/relay.py) and every process whose
    environment names the directory (SANDBOX_VAR: the agent and what it started, whatever its process group).
    Returns how many."""
    var, wrapper, n = f"{SANDBOX_VAR}={ctl}".encode(), f"{ctl}/relay.py".encode(), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if wrapper in argv or var in env:
            try:
                os.kill(int(entry), signal.SIGKILL)
                n += 1
            except OSError:
                pass
    return n


def sweep_stale_controls(bases: list[str] | None = None) -> tuple[int, int]:
    """Remove the control directories whose owner process is gone (a runner killed with -9 never removes its own),
    after killing what their `none` sandboxes left running. Only directories made here (OWNER_FILE) by this uid,
    and only when the owner's pid is dead or now another process (start time) — never a live run's.
    Returns (directories removed, processes killed)."""
    removed = killed = 0
    for base in bases if bases is not None else sorted({_control_base(), "/tmp"}):
        try:
            names = sorted(n for n in os.listdir(base) if n.startswith(CONTROL_PREFIX))
        except OSError:
            continue
        for name in names:
            d = Path(base) / name
            doc = _owner_doc(d)
            if doc is None:
                continue
            start = _start_ticks(doc["pid"])
            if start is not None and doc.get("start") in (None, start):
                continue  # its owner lives
            killed += _kill_left_behind(str(d))
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
    return removed, killed
