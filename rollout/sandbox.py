"""Sandboxes for agents and verifiers: bubblewrap, Docker, or none — one view, one network path out.

The view, the same for bwrap and docker: an empty root with, read-only, the system directories (usr, etc, bin, sbin,
lib*; the host's symlinks kept as symlinks), the Python installations the mounted venvs point into (only that
versions directory, e.g. /root/.pyenv/versions/3.12.1 — never /root), and `spec.mounts`; read-write `/app` (the cwd)
and HOME (`/home/agent`); `/tmp` a tmpfs; `/proc` and `/dev` minimal; `/run/polar` read-only, the sample's private
control directory (the wrapper, the agent's environment, the ready FIFO and, with a proxy, the relay's socket).
Nothing else of the host: not the repository, certs/, .cache/run/, RUN/, examples/, other samples, tasks' tests/.

The agent runs as uid:gid 1000:1000 for real (on the host too, not just inside a user namespace). bwrap started by
root uses no user namespace — with one, uid 1000 inside is root outside and can read root's 0600 files such as
/etc/shadow — and the wrapper drops from root to 1000:1000 with no capabilities and no_new_privs before anything
else; bwrap started by anyone else is `--unshare-all --uid 1000 --gid 1000` (uid 1000 inside is the caller).
docker: `--user 1000:1000 --network none --read-only --cap-drop ALL`.

Network: none at all (a fresh network namespace with only its own `lo`), except, when `spec.proxy_port` is set, the
relay (rollout/relay.py): the wrapper listens on 127.0.0.1:18080 in the sandbox and forwards each connection to the
socket; the host end (`HostRelay`, a thread here) opens a new TCP connection to the proxy per connection and puts
the sample's session in the first request head's Proxy-Authorization. `HTTPS_PROXY`/`https_proxy` point at the
relay with the session as user name, `NO_PROXY`/`no_proxy` are empty.

Limits: docker `--memory` (swap included) and `--cpus`; bwrap and none: a cgroup under the caller's own (v1 or v2)
when writable — memory, and CPU quota — else `prlimit --as`. `SandboxResult.memory_limit` says which. A timeout kills
the whole sandbox (the bwrap process group, whose pid namespace dies with it; `docker kill`; every process left in
the cgroup). `SandboxError` means the sandbox never started (infrastructure, never the agent's score): the wrapper
writes to the ready FIFO before it runs the agent, so a run that ends without that line is the sandbox's failure.

Dying with the runner: bwrap has --die-with-parent and its pid namespace; docker containers are labelled with the run
(the runner removes them at --resume); `none` has neither, so its wrapper is tied to the runner (relay.die_with:
a subreaper that kills the agent's whole tree when the runner dies, kill -9 included). Each control directory holds
OWNER_FILE (the pid and start time of the process that made it); `sweep_stale_controls` removes those whose owner is
gone, after killing whatever a `none` agent still left (found by SANDBOX_VAR in its environment).

Image mode (`spec.image_mode`, rollout/environments.py): the root is an image's own root filesystem, read-only, with
no host system directory over it — docker runs `spec.image` (`--read-only`), bwrap binds `spec.rootfs` (its export,
mount points made in it) at /. The sample's working directory is `spec.workdir` (the image's WORKDIR: a per-sample
copy, writable), HOME /home/agent, /tmp a tmpfs (`spec.tmp_mb` sizes it). What we run inside comes from one
read-only host prefix mounted at /run/polar/rt (rollout/runtime.py): the wrapper runs on its interpreter
(`spec.wrapper_python`), whatever the image's userland. Mounts may target /run/polar/NAME (a mount point the control
directory makes) and anything under another mount whose source holds the mount point; they are made parents first.
An image that cannot run the wrapper fails to start: a SandboxError naming the image.

Tripwire (`spec.tripwire`, the verifier's): the proxy variables point at the wrapper's relay, whose host end answers
every connection 403 and counts it (SandboxResult.proxy_connections): a verifier that tried the network is told
apart from one that failed.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from polar.rollout.cgroup import _Cgroup, limit_memory
from polar.rollout.control import CONTROL, ControlDir

KINDS = ("bwrap", "docker", "none")
UID = GID = 1000
APP = "/app"
HOME = "/home/agent"
RELAY_PORT = 18080
SYSTEM_PYTHON = "/usr/bin/python3"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_DIRS = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
DEFAULT_IMAGE = "polar-sandbox:1"
RESERVED = (CONTROL, "/proc", "/dev", "/tmp")
CONTROL_OWN = ("relay.py", "env.json", "ready", "proxy.sock", "owner.json")  # what a mount under /run/polar may not hide


class SandboxError(RuntimeError):
    """The sandbox could not be set up or started: an infrastructure failure, never the agent's score."""


@dataclass(frozen=True)
class Mount:
    host: Path
    inside: str
    writable: bool = False


@dataclass(frozen=True)
class SandboxSpec:
    kind: str
    app: Path
    home: Path
    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    proxy_port: int | None = None
    session: str | None = None
    memory_mb: int | None = None
    cpus: float | None = None
    image: str = DEFAULT_IMAGE
    label: str | None = None
    image_mode: bool = False  # the root is the image's own (docker: `image`; bwrap: `rootfs`), read-only
    rootfs: Path | None = None  # bwrap image mode: the image's exported root filesystem
    workdir: str = "/app"  # where `app` is mounted, the cwd (image mode: the image's WORKDIR)
    wrapper_python: str = SYSTEM_PYTHON  # the interpreter the wrapper runs on (image mode: the runtime's)
    tmp_mb: int | None = None  # the size of /tmp (task.toml storage_mb); None: the tmpfs default
    tripwire: bool = False  # no proxy: the relay answers 403 and counts the attempts (the verifier's)
    control_files: tuple[tuple[str, Path], ...] = ()  # (path under /run/polar, host file) copied into the control dir


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int | None  # None when timed out
    timed_out: bool
    wall_s: float
    memory_limit: str  # the limit in force, e.g. "cgroup v1 memory 2048 MiB", "prlimit --as 2048 MiB", "none"
    proxy_connections: int = 0  # connections the sandbox opened to the proxy (its relay's count)


# ---------------------------------------------------------------------------------------------- availability


def _bwrap_privileged() -> bool:
    return os.geteuid() == 0


def _bwrap_namespaces() -> list[str]:
    if _bwrap_privileged():
        # no user namespace: the wrapper becomes uid 1000 on the host too (see the module docstring)
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    return ["--unshare-all", "--uid", str(UID), "--gid", str(GID)]


def available(kind: str) -> str | None:
    """None if `kind` can run sandboxes here, else one line saying why not."""
    if kind not in KINDS:
        return f"unknown sandbox {kind!r} (bwrap, docker or none)"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing (the sandbox wrapper runs on it): apt-get install python3"
    if kind == "none":
        return None
    if kind == "bwrap":
        exe = shutil.which("bwrap")
        if not exe:
            return "bwrap is not installed (scripts/setup --system, or apt-get install bubblewrap)"
        cmd = [exe, *_bwrap_namespaces(), "--die-with-parent", "--proc", "/proc", "--dev", "/dev"]
        for path, link in _system_entries():
            cmd += ["--symlink", link, path] if link is not None else ["--ro-bind", path, path]
        cmd.append("/usr/bin/true")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap does not start a sandbox: {e}"
        if p.returncode != 0:
            return f"bwrap does not start a sandbox: {(p.stderr.strip().splitlines() or [f'exit {p.returncode}'])[-1]}"
        return None
    exe = shutil.which("docker")
    if not exe:
        return "the docker client is not installed (scripts/setup --system, or apt-get install docker.io)"
    try:
        p = subprocess.run([exe, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True,
                           timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"dockerd is not answering ({os.environ.get('DOCKER_HOST', 'default socket')}): {e}"
    if p.returncode != 0 or not p.stdout.strip():
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        return f"dockerd is not answering ({os.environ.get('DOCKER_HOST', 'default socket')}): {why}"
    return None


_images_ready: set[tuple[str, str]] = set()
_images_lock = threading.Lock()


def ensure_image(image: str = DEFAULT_IMAGE) -> None:
    """docker: make sure `image` exists; `polar-sandbox:1` (or any missing image name) is imported from an empty tar —
    the sandbox's whole system comes from read-only binds of the host's."""
    key = (os.environ.get("DOCKER_HOST", ""), image)
    with _images_lock:
        if key in _images_ready:
            return
        exe = shutil.which("docker")
        if not exe:
            raise SandboxError("the docker client is not installed")
        try:
            p = subprocess.run([exe, "image", "inspect", "--format", "{{.Id}}", image], capture_output=True,
                               timeout=30, stdin=subprocess.DEVNULL)
            if p.returncode != 0:
                buf = io.BytesIO()
                tarfile.open(fileobj=buf, mode="w").close()
                p = subprocess.run([exe, "import", "-", image], input=buf.getvalue(), capture_output=True, timeout=60)
                if p.returncode != 0:
                    raise SandboxError(f"docker import {image} failed: {p.stderr.decode(errors='replace').strip()}")
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SandboxError(f"docker image {image}: {e}") from e
        _images_ready.add(key)


# ---------------------------------------------------------------------------------------------- the view


def _system_entries() -> list[tuple[str, str | None]]:
    """(/dir, symlink target or None for a directory) for each system directory the host has."""
    out = []
    for name in SYSTEM_DIRS:
        p = Path("/") / name
        if p.is_symlink():
            out.append((str(p), os.readlink(p)))
        elif p.is_dir():
            out.append((str(p), None))
    return out


def _under(path: str, roots: tuple[str, ...]) -> bool:
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
            if s != "/" and prefix.is_dir() and not _under(s, system) and s not in found:
                found.append(s)
    return found


def _venvs(spec: SandboxSpec) -> list[Path]:
    return [Path(m.host) for m in spec.mounts if (Path(m.host) / "pyvenv.cfg").is_file()]


def _check(spec: SandboxSpec) -> None:
    if spec.kind not in KINDS:
        raise SandboxError(f"unknown sandbox {spec.kind!r} (bwrap, docker or none)")
    for what, p in (("app", spec.app), ("home", spec.home)):
        if not Path(p).is_dir():
            raise SandboxError(f"sandbox {what} directory {p} does not exist")
    for m in spec.mounts:
        if not Path(m.host).exists():
            raise SandboxError(f"mount source {m.host} does not exist")
        if not m.inside.startswith("/") or os.path.normpath(m.inside) != m.inside or m.inside == "/":
            raise SandboxError(f"mount target {m.inside!r} must be an absolute, normalized path")
        if _under(m.inside, RESERVED) and not _control_mount(m.inside):
            raise SandboxError(f"mount target {m.inside} is reserved by the sandbox")
    if spec.image_mode:
        if spec.kind not in ("bwrap", "docker"):
            raise SandboxError(f"an image runs in --sandbox bwrap or docker, not {spec.kind}")
        if spec.kind == "bwrap" and (spec.rootfs is None or not Path(spec.rootfs).is_dir()):
            raise SandboxError(f"the image's root filesystem {spec.rootfs} is missing (exported by the runner)")
        if not spec.workdir.startswith("/") or os.path.normpath(spec.workdir) != spec.workdir or \
                _under(spec.workdir, RESERVED) or spec.workdir == "/":
            raise SandboxError(f"working directory {spec.workdir!r} must be an absolute, normalized path of its own")
    if spec.kind == "docker":
        for p in [str(spec.app), str(spec.home), *(str(m.host) for m in spec.mounts), *(m.inside for m in spec.mounts)]:
            if any(c in p for c in ',"\n'):
                raise SandboxError(f"docker cannot bind a path containing a comma, quote or newline: {p!r}")
    if spec.proxy_port is not None and not spec.session:
        raise SandboxError("a sandbox with a proxy needs its session (the relay's identity)")
    if spec.tripwire and spec.proxy_port is not None:
        raise SandboxError("a tripwire sandbox has no proxy")


def _control_mount(inside: str) -> bool:
    """A mount under /run/polar that hides none of the control directory's own files."""
    rest = inside[len(CONTROL) + 1:] if inside.startswith(CONTROL + "/") else ""
    return bool(rest) and rest.split("/")[0] not in CONTROL_OWN


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def _chmod_tree_open(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o777)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o666)


def _owner(spec: SandboxSpec) -> tuple[int, int] | None:
    """The host uid:gid that must own the sample's writable dirs and control files (None: the caller already is)."""
    if spec.kind != "none" and os.geteuid() == 0:
        return UID, GID
    return None


# ---------------------------------------------------------------------------------------------- control directory


class _Control(ControlDir):
    """The control directory of a sandbox of this module: the agent's HOME and PATH in its environment."""

    def __init__(self, spec: SandboxSpec, owner: tuple[int, int] | None):
        env = dict(spec.env)
        env["HOME"] = str(spec.home) if spec.kind == "none" else HOME
        env.setdefault("PATH", DEFAULT_PATH)
        super().__init__(spec, owner, env)


# ---------------------------------------------------------------------------------------------- command lines


def _wrapper(spec: SandboxSpec, ctl: _Control, argv: list[str]) -> list[str]:
    k = spec.kind
    cmd = [spec.wrapper_python, ctl.inside("relay.py", k), "sandbox", "--env", ctl.inside("env.json", k),
           "--ready", ctl.inside("ready", k)]
    if spec.proxy_port is not None or spec.tripwire:
        cmd += ["--socket", ctl.inside("proxy.sock", k), "--port", str(0 if k == "none" else RELAY_PORT)]
    if k == "bwrap" and _bwrap_privileged():
        cmd += ["--drop", f"{UID}:{GID}"]
    if k == "none":  # no namespace or container ends the agent with the runner: the wrapper must (relay.die_with)
        cmd += ["--die-with", str(os.getpid())]
    return [*cmd, "--", *argv]


def _tmpfs_size(spec: SandboxSpec) -> list[str]:
    return ["--size", str(spec.tmp_mb * 1024 * 1024)] if spec.tmp_mb else []


def _ordered(mounts) -> list[Mount]:
    """Parents first: a mount under another (the runtime's site-packages) is made after it."""
    return sorted(mounts, key=lambda m: m.inside.count("/"))


def bwrap_image_command(spec: SandboxSpec, ctl: _Control, argv: list[str]) -> list[str]:
    """bwrap over the image's exported root: read-only at /, nothing of the host's system (the module docstring)."""
    cmd = [shutil.which("bwrap") or "bwrap", *_bwrap_namespaces(), "--die-with-parent", "--new-session",
           "--clearenv", "--hostname", "polar-sandbox", "--ro-bind", str(spec.rootfs), "/",
           "--proc", "/proc", "--dev", "/dev", *_tmpfs_size(spec), "--perms", "1777", "--tmpfs", "/tmp",
           "--ro-bind", str(ctl.dir), CONTROL]
    for m in _ordered(spec.mounts):
        cmd += ["--bind" if m.writable else "--ro-bind", str(m.host), m.inside]
    cmd += ["--bind", str(spec.app), spec.workdir, "--bind", str(spec.home), HOME, "--chdir", spec.workdir]
    return [*cmd, *_wrapper(spec, ctl, argv)]


def bwrap_command(spec: SandboxSpec, ctl: _Control, argv: list[str]) -> list[str]:
    if spec.image_mode:
        return bwrap_image_command(spec, ctl, argv)
    binds: list[tuple[str, str, str]] = []  # (option, source, target)
    for prefix in python_prefixes(_venvs(spec)):
        binds.append(("--ro-bind", prefix, prefix))
    for m in spec.mounts:
        binds.append(("--bind" if m.writable else "--ro-bind", str(m.host), m.inside))
    binds += [("--bind", str(spec.app), APP), ("--bind", str(spec.home), HOME), ("--ro-bind", str(ctl.dir), CONTROL)]
    cmd = [shutil.which("bwrap") or "bwrap", *_bwrap_namespaces(), "--die-with-parent", "--new-session",
           "--clearenv", "--hostname", "polar-sandbox"]
    system = _system_entries()
    for path, link in system:
        cmd += ["--symlink", link, path] if link is not None else ["--ro-bind", path, path]
    # --perms: a tmpfs bwrap makes is root's 0755, uid 1000 cannot write there
    # (Gemini CLI's shell tool then fails with EACCES; Claude Code exits 0 after ~30 s without calling the model)
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    # bwrap makes the missing parents of a target 0700 (root's): make them 0755 first, or uid 1000 cannot reach
    # /run/polar or /home/agent. Only parents on the empty root, never inside another bind.
    targets = tuple(p for p, _ in system) + ("/proc", "/dev", "/tmp") + tuple(t for _, _, t in binds)
    parents: list[str] = []
    for _, _, target in binds:
        for parent in reversed(Path(target).parents[:-1] if len(Path(target).parents) > 1 else ()):
            s = str(parent)
            if s not in parents and not _under(s, targets):
                parents.append(s)
    for parent in sorted(parents, key=lambda s: s.count("/")):
        cmd += ["--perms", "0755", "--dir", parent]
    for opt, src, dst in binds:
        cmd += [opt, src, dst]
    cmd += ["--chdir", APP]
    return [*cmd, *_wrapper(spec, ctl, argv)]


def docker_command(spec: SandboxSpec, ctl: _Control, argv: list[str], name: str) -> list[str]:
    tmp = "/tmp:rw,nosuid,nodev,mode=1777" + (f",size={spec.tmp_mb}m" if spec.tmp_mb else "")
    cmd = [shutil.which("docker") or "docker", "run", "--rm", "--name", name, "--network", "none",
           "--user", f"{UID}:{GID}", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
           "--hostname", "polar-sandbox", "--workdir", spec.workdir if spec.image_mode else APP, "--tmpfs", tmp]
    if spec.label:
        cmd += ["--label", f"polar-run={spec.label}"]
    if spec.memory_mb is not None:
        cmd += ["--memory", f"{spec.memory_mb}m", "--memory-swap", f"{spec.memory_mb}m"]
    if spec.cpus is not None:
        cmd += ["--cpus", f"{spec.cpus:g}"]

    def bind(src: str, dst: str, writable: bool = False) -> list[str]:
        return ["--mount", f"type=bind,source={src},target={dst}" + ("" if writable else ",readonly")]

    if spec.image_mode:  # the image's own root: no host system directory, the wrapper on the runtime's python
        wrapper = _wrapper(spec, ctl, argv)
        cmd += bind(str(ctl.dir), CONTROL)
        for m in _ordered(spec.mounts):
            cmd += bind(str(m.host), m.inside, m.writable)
        cmd += bind(str(spec.app), spec.workdir, True) + bind(str(spec.home), HOME, True)
        return [*cmd, "--entrypoint", wrapper[0], spec.image, *wrapper[1:]]
    for path, link in _system_entries():
        cmd += bind(os.path.realpath(path) if link is not None else path, path)
    for prefix in python_prefixes(_venvs(spec)):
        cmd += bind(prefix, prefix)
    for m in spec.mounts:
        cmd += bind(str(m.host), m.inside, m.writable)
    cmd += bind(str(spec.app), APP, True) + bind(str(spec.home), HOME, True) + bind(str(ctl.dir), CONTROL)
    return [*cmd, spec.image, *_wrapper(spec, ctl, argv)]


# ---------------------------------------------------------------------------------------------- running


def _tail(path: Path, n: int = 600) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _docker_kill(name: str) -> None:
    exe = shutil.which("docker") or "docker"
    for sub in (["kill", name], ["rm", "-f", name]):
        try:
            subprocess.run([exe, *sub], capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _hand_over(spec: SandboxSpec) -> tuple[int, int] | None:
    """Make the sample's writable directories (app, HOME, writable mounts) writable by the sandbox's uid 1000."""
    owner = _owner(spec)
    try:
        for d in [Path(spec.app), Path(spec.home), *(Path(m.host) for m in spec.mounts if m.writable)]:
            if owner is not None:
                _chown_tree(d, *owner)
            elif spec.kind == "docker" and os.geteuid() != UID:
                _chmod_tree_open(d)
    except OSError as e:
        raise SandboxError(f"cannot hand the sample's directories to uid {UID}: {e}") from e
    return owner


def _command(spec: SandboxSpec, ctl: _Control, argv: list[str], name: str) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment, cwd) of the host process that is the sandbox."""
    if spec.kind == "bwrap":
        return bwrap_command(spec, ctl, argv), {"PATH": DEFAULT_PATH}, "/"
    if spec.kind == "docker":
        return docker_command(spec, ctl, argv, name), dict(os.environ), "/"
    return _wrapper(spec, ctl, argv), {"PATH": DEFAULT_PATH}, str(spec.app)


def _supervise(cmd: list[str], env: dict[str, str], cwd: str, stdout: Path, stderr: Path, timeout: float,
               kill_extra) -> tuple[int | None, bool, float]:
    """Run the sandbox process to its end or the timeout: (exit code, timed out, wall seconds). On a timeout, or
    when the caller is interrupted, everything is killed before this returns or raises."""
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=cwd,
                                    start_new_session=True)
        except OSError as e:
            raise SandboxError(f"cannot start the sandbox ({cmd[0]}): {e}") from e

        def kill() -> None:
            kill_extra()
            _killpg(proc.pid)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill()
        except BaseException:  # cancelled (Ctrl-C): nothing may outlive the call
            kill()
            raise
        finally:
            wall = time.monotonic() - t0
            _killpg(proc.pid)  # what the agent left in its process group (none: there is no pid namespace)
        return (None if timed_out else proc.returncode), timed_out, wall


def run_sandboxed(spec: SandboxSpec, argv: list[str], *, stdout: Path, stderr: Path, timeout: float) -> SandboxResult:
    """Run `argv` in a fresh sandbox with cwd /app; its stdout and stderr go to the given files.

    Returns once the sandbox is gone. Raises SandboxError when the sandbox could not be set up or never started
    (the agent never ran); the message is bwrap's or docker's own when they said why."""
    if not argv:
        raise SandboxError("no command")
    _check(spec)
    if not spec.image_mode and not os.access(SYSTEM_PYTHON, os.X_OK):
        raise SandboxError(f"{SYSTEM_PYTHON} is missing (the sandbox wrapper runs on it)")
    if spec.kind != "none" and shutil.which(spec.kind) is None:
        raise SandboxError(available(spec.kind) or f"{spec.kind} is not installed")
    if spec.kind == "docker" and not spec.image_mode:
        ensure_image(spec.image)
    owner = _hand_over(spec)
    try:
        ctl = _Control(spec, owner)
    except OSError as e:
        raise SandboxError(f"sandbox control directory: {e}") from e
    cgroup: _Cgroup | None = None
    name = f"polar-{uuid.uuid4().hex[:16]}"

    def kill_extra() -> None:
        if spec.kind == "docker":
            _docker_kill(name)
        if cgroup is not None:
            cgroup.kill_all()

    try:
        prefix, cgroup, memory_limit = limit_memory(spec.kind, spec.memory_mb, spec.cpus)
        cmd, env, cwd = _command(spec, ctl, argv, name)
        code, timed_out, wall = _supervise(prefix + cmd, env, cwd, stdout, stderr, timeout, kill_extra)
        if cgroup is not None:
            cgroup.kill_all()
        if not ctl.ready().startswith("ready "):
            if timed_out:
                raise SandboxError(f"the {spec.kind} sandbox did not start within {timeout:g} s")
            if spec.image_mode:
                raise SandboxError(f"the {spec.kind} sandbox did not start in image {spec.image} (exit {code}; can "
                                   f"the image run the sandbox runtime {spec.wrapper_python}?): "
                                   f"{_tail(Path(stderr)) or 'no message'}")
            raise SandboxError(f"the {spec.kind} sandbox did not start (exit {code}): "
                               f"{_tail(Path(stderr)) or 'no message'}")
        return SandboxResult(exit_code=code, timed_out=timed_out, wall_s=wall, memory_limit=memory_limit,
                             proxy_connections=ctl.relay.connections if ctl.relay is not None else 0)
    finally:
        if cgroup is not None:
            cgroup.remove()
        ctl.close()


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
