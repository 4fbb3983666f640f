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
relay (rollout/sandbox/relay.py): the wrapper listens on 127.0.0.1:18080 in the sandbox and forwards each connection to the
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

Image mode (`spec.image_mode`, rollout/images/environments.py): the root is an image's own root filesystem, read-only, with
no host system directory over it — docker runs `spec.image` (`--read-only`), bwrap binds `spec.rootfs` (its export,
mount points made in it) at /. An agent's root is writable through a layer of its own (`spec.root_writable`: docker's
container layer over `polar-owned:<id>`, bwrap's overlay view that the runner mounted), discarded with it. The sample's working directory is `spec.workdir` (the image's WORKDIR: a per-sample
copy, writable), HOME /home/agent, /tmp a tmpfs (`spec.tmp_mb` sizes it). What we run inside comes from one
read-only host prefix mounted at /run/polar/rt (rollout/images/runtime.py): the wrapper runs on its interpreter
(`spec.wrapper_python`), whatever the image's userland. Mounts may target /run/polar/NAME (a mount point the control
directory makes) and anything under another mount whose source holds the mount point; they are made parents first.
An image that cannot run the wrapper fails to start: a SandboxError naming the image.

Tripwire (`spec.tripwire`, the verifier's): the proxy variables point at the wrapper's relay, whose host end answers
every connection 403 and counts it (SandboxResult.proxy_connections): a verifier that tried the network is told
apart from one that failed.
"""


from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from polar.rollout.sandbox import registry
from polar.rollout.sandbox.base import SYSTEM_PYTHON, SandboxError, SandboxResult, SandboxSpec
from polar.rollout.sandbox.cgroup import _Cgroup
from polar.rollout.sandbox.view import Control, check, hand_over


# ---------------------------------------------------------------------------------------------- running


def _tail(path: Path, n: int = 600) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


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
    backend = registry.get(spec.kind)
    check(spec, backend)
    if not spec.image_mode and not os.access(SYSTEM_PYTHON, os.X_OK):
        raise SandboxError(f"{SYSTEM_PYTHON} is missing (the sandbox wrapper runs on it)")
    backend.prepare(spec)
    owner = hand_over(spec, backend, open_to_all=backend.real_uid)
    try:
        ctl = Control(spec, backend, owner)
    except OSError as e:
        raise SandboxError(f"sandbox control directory: {e}") from e
    cgroup: _Cgroup | None = None
    name = f"polar-{uuid.uuid4().hex[:16]}"

    def kill_extra() -> None:
        backend.kill(name)
        if cgroup is not None:
            cgroup.kill_all()

    try:
        prefix, cgroup, memory_limit = backend.memory_limit(spec)
        cmd, env, cwd = backend.command(spec, ctl, argv, name)
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
