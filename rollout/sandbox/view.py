"""What every backend's sandbox shares: the host's system directories and Python prefixes it shows, the checks of a
spec, the control directory with the agent's HOME and PATH, the wrapper's command line, and the hand-over of the
sample's writable directories to uid 1000 (the view itself: rollout/sandbox/run.py's docstring)."""

from __future__ import annotations

import os
from pathlib import Path

from polar.rollout.sandbox.base import (DEFAULT_PATH, GID, HOME, RELAY_PORT, SYSTEM_DIRS, UID, Mount, Sandbox,
                                        SandboxError, SandboxSpec)
from polar.rollout.sandbox.control import CONTROL, ControlDir

RESERVED = (CONTROL, "/proc", "/dev", "/tmp")
CONTROL_OWN = ("relay.py", "env.json", "ready", "proxy.sock", "owner.json")  # what a mount under /run/polar may not hide


def system_entries() -> list[tuple[str, str | None]]:
    """(/dir, symlink target or None for a directory) for each system directory the host has."""
    out = []
    for name in SYSTEM_DIRS:
        p = Path("/") / name
        if p.is_symlink():
            out.append((str(p), os.readlink(p)))
        elif p.is_dir():
            out.append((str(p), None))
    return out


def under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def python_prefixes(venvs: list[Path]) -> list[str]:
    """The real installation prefixes the given venvs' interpreters live in (e.g. /root/.pyenv/versions/3.12.1),
    outside the system directories, each exactly that directory (never its parents)."""
    system = tuple(str(Path("/") / d) for d in SYSTEM_DIRS) + tuple(
        os.path.realpath(Path("/") / d) for d in SYSTEM_DIRS)
    found: list[str] = []
    for venv in venvs:
        cands = []
        for name in ("python", "python3"):
            exe = venv / "bin" / name
            if exe.exists():
                cands.append(Path(os.path.realpath(exe)).parent.parent)
                break
        cfg = venv / "pyvenv.cfg"
        if cfg.is_file():
            for line in cfg.read_text(errors="replace").splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip() == "home":
                    home = Path(os.path.realpath(value.strip()))
                    cands.append(home.parent if home.name == "bin" else home)
        for prefix in cands:
            s = str(prefix)
            if s != "/" and prefix.is_dir() and not under(s, system) and s not in found:
                found.append(s)
    return found


def venvs_of(spec: SandboxSpec) -> list[Path]:
    return [Path(m.host) for m in spec.mounts if (Path(m.host) / "pyvenv.cfg").is_file()]


def check(spec: SandboxSpec, backend: Sandbox) -> None:
    """SandboxError naming the first thing wrong with `spec` for `backend`."""
    for what, p in (("app", spec.app), ("home", spec.home)):
        if not Path(p).is_dir():
            raise SandboxError(f"sandbox {what} directory {p} does not exist")
    for m in spec.mounts:
        if not Path(m.host).exists():
            raise SandboxError(f"mount source {m.host} does not exist")
        if not m.inside.startswith("/") or os.path.normpath(m.inside) != m.inside or m.inside == "/":
            raise SandboxError(f"mount target {m.inside!r} must be an absolute, normalized path")
        if under(m.inside, RESERVED) and not _control_mount(m.inside):
            raise SandboxError(f"mount target {m.inside} is reserved by the sandbox")
    if spec.image_mode:
        if not backend.runs_images:
            raise SandboxError(f"an image runs in a sandbox that runs images (--sandbox bwrap or docker), "
                               f"not {spec.kind}")
        if backend.exports_rootfs and (spec.rootfs is None or not Path(spec.rootfs).is_dir()):
            raise SandboxError(f"the image's root filesystem {spec.rootfs} is missing (exported by the runner)")
        if not spec.workdir.startswith("/") or os.path.normpath(spec.workdir) != spec.workdir or \
                under(spec.workdir, RESERVED) or spec.workdir == "/":
            raise SandboxError(f"working directory {spec.workdir!r} must be an absolute, normalized path of its own")
    if spec.proxy_port is not None and not spec.session:
        raise SandboxError("a sandbox with a proxy needs its session (the relay's identity)")
    if spec.tripwire and spec.proxy_port is not None:
        raise SandboxError("a tripwire sandbox has no proxy")


def _control_mount(inside: str) -> bool:
    """A mount under /run/polar that hides none of the control directory's own files."""
    rest = inside[len(CONTROL) + 1:] if inside.startswith(CONTROL + "/") else ""
    return bool(rest) and rest.split("/")[0] not in CONTROL_OWN


def chown_tree(root: Path, uid: int, gid: int, only_root: bool = False, dirs_only: bool = False) -> None:
    """Every entry under `root` owned by uid:gid (`only_root`: the root alone; `dirs_only`: its directories); one it
    already is, untouched (through an overlay, a sample's working directory, a chown is a copy-up of the file)."""
    def own(path) -> None:
        st = os.lstat(path)
        if st.st_uid != uid or st.st_gid != gid:
            os.lchown(path, uid, gid)

    own(root)
    if only_root:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames if dirs_only else dirnames + filenames:
            own(os.path.join(dirpath, name))


def _chmod_tree_open(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o777)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o666)


def owner(backend: Sandbox) -> tuple[int, int] | None:
    """The host uid:gid that must own the sample's writable dirs and control files (None: the caller already is)."""
    if backend.isolated and os.geteuid() == 0:
        return UID, GID
    return None


def hand_over(spec: SandboxSpec, backend: Sandbox, open_to_all: bool = False) -> tuple[int, int] | None:
    """Make the sample's writable directories (app, HOME, writable mounts) writable by the sandbox's uid 1000:
    chowned when we are root, else opened to all when `open_to_all` (an engine whose uid 1000 is not ours)."""
    who = owner(backend)
    try:
        for d in [Path(spec.app), Path(spec.home), *(Path(m.host) for m in spec.mounts if m.writable)]:
            if who is not None:
                chown_tree(d, *who, only_root=spec.app_owned and d == Path(spec.app))
            elif open_to_all and os.geteuid() != UID:
                _chmod_tree_open(d)
    except OSError as e:
        raise SandboxError(f"cannot hand the sample's directories to uid {UID}: {e}") from e
    return who


class Control(ControlDir):
    """The control directory of one sandbox: the agent's HOME and PATH in its environment (HOME is the sample's
    host folder when the agent is on the host)."""

    def __init__(self, spec: SandboxSpec, backend: Sandbox, owner: tuple[int, int] | None):
        env = dict(spec.env)
        env["HOME"] = HOME if backend.isolated else str(spec.home)
        env.setdefault("PATH", DEFAULT_PATH)
        super().__init__(spec, owner, env, isolated=backend.isolated)


def wrapper(spec: SandboxSpec, ctl: ControlDir, argv: list[str], extra: tuple[str, ...] = ()) -> list[str]:
    """The wrapper's command line (rollout/sandbox/relay.py `sandbox`): the agent's environment, the ready FIFO, the
    relay's socket and port (0, any, on the host), then `extra` (a backend's own options), then the agent's argv."""
    cmd = [spec.wrapper_python, ctl.inside("relay.py"), "sandbox", "--env", ctl.inside("env.json"),
           "--ready", ctl.inside("ready")]
    if spec.proxy_port is not None or spec.tripwire:
        cmd += ["--socket", ctl.inside("proxy.sock"), "--port", str(RELAY_PORT if ctl.isolated else 0)]
    return [*cmd, *extra, "--", *argv]


def tmpfs_size(spec: SandboxSpec) -> list[str]:
    return ["--size", str(spec.tmp_mb * 1024 * 1024)] if spec.tmp_mb else []


def ordered(mounts) -> list[Mount]:
    """Parents first: a mount under another (the runtime's site-packages) is made after it."""
    return sorted(mounts, key=lambda m: m.inside.count("/"))
