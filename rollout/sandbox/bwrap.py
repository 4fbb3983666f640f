"""The bubblewrap backend: namespaces on the host, the view made of binds (an empty root with the host's system
directories read-only, or an image's exported root filesystem). As root it uses no user namespace and the wrapper
drops to uid 1000 itself; as anyone else, `--unshare-all --uid 1000 --gid 1000` (rollout/sandbox/run.py's
docstring says why)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from polar.rollout.sandbox.base import APP, DEFAULT_PATH, GID, HOME, UID, SandboxError, SandboxSpec
from polar.rollout.sandbox.cgroup import limit_memory
from polar.rollout.sandbox.control import CONTROL, ControlDir
from polar.rollout.sandbox.view import ordered, python_prefixes, system_entries, tmpfs_size, under, venvs_of, wrapper


def privileged() -> bool:
    return os.geteuid() == 0


def namespaces() -> list[str]:
    if privileged():
        # no user namespace: the wrapper becomes uid 1000 on the host too (see the module docstring)
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    return ["--unshare-all", "--uid", str(UID), "--gid", str(GID)]


def _wrapper(spec: SandboxSpec, ctl: ControlDir, argv: list[str]) -> list[str]:
    return wrapper(spec, ctl, argv, ("--drop", f"{UID}:{GID}") if privileged() else ())


def bwrap_image_command(spec: SandboxSpec, ctl: ControlDir, argv: list[str]) -> list[str]:
    """bwrap over the image's exported root at / (read-only, or the sample's overlay view of it when
    `root_writable`), nothing of the host's system."""
    cmd = [shutil.which("bwrap") or "bwrap", *namespaces(), "--die-with-parent", "--new-session",
           "--clearenv", "--hostname", "polar-sandbox", "--bind" if spec.root_writable else "--ro-bind",
           str(spec.rootfs), "/",
           "--proc", "/proc", "--dev", "/dev", *tmpfs_size(spec), "--perms", "1777", "--tmpfs", "/tmp",
           "--ro-bind", str(ctl.dir), CONTROL]
    for m in ordered(spec.mounts):
        cmd += ["--bind" if m.writable else "--ro-bind", str(m.host), m.inside]
    cmd += ["--bind", str(spec.app), spec.workdir, "--bind", str(spec.home), HOME, "--chdir", spec.workdir]
    return [*cmd, *_wrapper(spec, ctl, argv)]


def bwrap_command(spec: SandboxSpec, ctl: ControlDir, argv: list[str]) -> list[str]:
    if spec.image_mode:
        return bwrap_image_command(spec, ctl, argv)
    binds: list[tuple[str, str, str]] = []  # (option, source, target)
    for prefix in python_prefixes(venvs_of(spec)):
        binds.append(("--ro-bind", prefix, prefix))
    for m in spec.mounts:
        binds.append(("--bind" if m.writable else "--ro-bind", str(m.host), m.inside))
    binds += [("--bind", str(spec.app), APP), ("--bind", str(spec.home), HOME), ("--ro-bind", str(ctl.dir), CONTROL)]
    cmd = [shutil.which("bwrap") or "bwrap", *namespaces(), "--die-with-parent", "--new-session",
           "--clearenv", "--hostname", "polar-sandbox"]
    system = system_entries()
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
            if s not in parents and not under(s, targets):
                parents.append(s)
    for parent in sorted(parents, key=lambda s: s.count("/")):
        cmd += ["--perms", "0755", "--dir", parent]
    for opt, src, dst in binds:
        cmd += [opt, src, dst]
    cmd += ["--chdir", APP]
    return [*cmd, *_wrapper(spec, ctl, argv)]


class Bwrap:
    kind = "bwrap"
    isolated = True
    runs_images = True
    exports_rootfs = True  # bwrap has no image store: an image runs from its root filesystem, exported
    warm_slots = True
    labels_runs = False  # its pid namespace dies with the runner (--die-with-parent)
    real_uid = False

    def available(self) -> str | None:
        exe = shutil.which("bwrap")
        if not exe:
            return "bwrap is not installed (scripts/setup --system, or apt-get install bubblewrap)"
        cmd = [exe, *namespaces(), "--die-with-parent", "--proc", "/proc", "--dev", "/dev"]
        for path, link in system_entries():
            cmd += ["--symlink", link, path] if link is not None else ["--ro-bind", path, path]
        cmd.append("/usr/bin/true")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap does not start a sandbox: {e}"
        if p.returncode != 0:
            return f"bwrap does not start a sandbox: {(p.stderr.strip().splitlines() or [f'exit {p.returncode}'])[-1]}"
        return None

    def prepare(self, spec: SandboxSpec) -> None:
        if shutil.which("bwrap") is None:
            raise SandboxError(self.available() or "bwrap is not installed")

    def command(self, spec: SandboxSpec, ctl: ControlDir, argv: list[str], name: str):
        return bwrap_command(spec, ctl, argv), {"PATH": DEFAULT_PATH}, "/"

    def memory_limit(self, spec: SandboxSpec):
        return limit_memory(spec.memory_mb, spec.cpus)

    def kill(self, name: str) -> None:
        pass  # its process group is the whole sandbox: the pid namespace dies with bwrap

    def cleanup(self, label: str) -> int:
        return 0


BACKEND = Bwrap()
