"""The docker backend: one container per sandbox (`--user 1000:1000 --network none --read-only --cap-drop ALL`),
against the daemon of DOCKER_HOST; the view made of bind mounts over an empty image (`polar-sandbox:1`, imported from
an empty tar), or the task's image as the root — read-only, or for an agent (`root_writable`) without --read-only,
over the image with its directories handed to uid 1000 (`polar-owned:<id>`, made once per image). Containers are
labelled with the run (`polar-run=<run id>`), so a resumed or cancelled run removes what a dead attempt left."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import threading

from polar.rollout.sandbox.base import APP, DEFAULT_IMAGE, GID, HOME, UID, SandboxError, SandboxSpec
from polar.rollout.sandbox.control import CONTROL, ControlDir
from polar.rollout.sandbox.view import ordered, python_prefixes, system_entries, venvs_of, wrapper

_images_ready: set[tuple[str, str]] = set()
_images_lock = threading.Lock()


def ensure_image(image: str = DEFAULT_IMAGE) -> None:
    """Make sure `image` exists; `polar-sandbox:1` (or any missing image name) is imported from an empty tar — the
    sandbox's whole system comes from read-only binds of the host's."""
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


OWNED_REPO = "polar-owned"  # an image with its directories the sandbox uid's: `polar-owned:<the image's id>`
OWNED_LABEL = "org.polar.owned.from"
# Run by the runtime's python in the image (-I: no PYTHON* variable of the image's reaches it), as the image's root
# with CAP_CHOWN and CAP_DAC_READ_SEARCH: every directory of the image's own filesystem (not /proc, /sys, /dev or a
# mount: another st_dev) handed to uid:gid. A directory's chown is a metadata copy-up in the new layer; a file's
# would copy its data, so files keep their owner.
HAND_OVER = """import os, sys
uid = gid = int(sys.argv[1])
dev = os.lstat("/").st_dev
for top, dirs, _ in os.walk("/"):
    dirs[:] = [d for d in dirs if os.lstat(os.path.join(top, d)).st_dev == dev]
    st = os.lstat(top)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.lchown(top, uid, gid)
"""
_owned_ready: set[tuple[str, str]] = set()
_owned_lock = threading.Lock()


def owned_tag(image: str) -> str:
    """The tag of `image` (an id, `sha256:…`, as image mode names it) with its directories the sandbox uid's."""
    return f"{OWNED_REPO}:{image.split(':')[-1][:32]}"


def ensure_owned(spec: SandboxSpec) -> str:
    """`polar-owned:<id>` made once per daemon and image (a container of the image hands its directories to uid
    1000, committed): the agent's writable root, whose container layer is its own and goes with it (--rm). The
    runtime's interpreter (the mount holding `spec.wrapper_python`) does it, so the image needs no tool of its own."""
    tag = owned_tag(spec.image)
    key = (os.environ.get("DOCKER_HOST", ""), tag)
    with _owned_lock:
        if key in _owned_ready:
            return tag
        exe = shutil.which("docker") or "docker"

        def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
            try:
                return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                                      stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise SandboxError(f"docker {args[0]} for the agent's writable root: {e}") from e

        if docker("image", "inspect", "--format", "{{.Id}}", tag).returncode != 0:
            runtime = [m for m in spec.mounts if spec.wrapper_python.startswith(m.inside.rstrip("/") + "/")]
            if not runtime:
                raise SandboxError("no mount holds the wrapper's interpreter (the sandbox runtime)")
            name = f"polar-own-{tag.split(':')[1][:12]}-{os.getpid()}"
            run = [
                "run", "--name", name, "--network", "none", "--user", "0:0", "--cap-drop", "ALL", "--cap-add",
                "CHOWN", "--cap-add", "DAC_READ_SEARCH", "--security-opt", "no-new-privileges", "--mount",
                f"type=bind,source={runtime[0].host},target={runtime[0].inside},readonly",
                "--entrypoint", spec.wrapper_python, spec.image, "-I", "-c", HAND_OVER, str(UID)]
            try:
                done = docker(*run, timeout=600)
                if done.returncode != 0:
                    raise SandboxError(f"handing the image's directories to uid {UID} failed: "
                                       f"{(done.stderr.strip().splitlines() or [f'exit {done.returncode}'])[-1]}")
                done = docker("commit", "--change", f"LABEL {OWNED_LABEL}={spec.image}", name, tag)
                if done.returncode != 0:
                    raise SandboxError(f"docker commit of the agent's writable root failed: {done.stderr.strip()}")
            finally:
                docker("rm", "-f", name)
        _owned_ready.add(key)
        return tag


def docker_command(spec: SandboxSpec, ctl: ControlDir, argv: list[str], name: str) -> list[str]:
    tmp = "/tmp:rw,nosuid,nodev,mode=1777" + (f",size={spec.tmp_mb}m" if spec.tmp_mb else "")
    writable = spec.image_mode and spec.root_writable  # the container's own layer: gone with it (--rm)
    cmd = [shutil.which("docker") or "docker", "run", "--rm", "--name", name, "--network", "none",
           "--user", f"{UID}:{GID}", *([] if writable else ["--read-only"]), "--cap-drop", "ALL", "--security-opt",
           "no-new-privileges", "--hostname", "polar-sandbox", "--workdir", spec.workdir if spec.image_mode else APP,
           "--tmpfs", tmp]
    if spec.label:
        cmd += ["--label", f"polar-run={spec.label}"]
    if spec.memory_mb is not None:
        cmd += ["--memory", f"{spec.memory_mb}m", "--memory-swap", f"{spec.memory_mb}m"]
    if spec.cpus is not None:
        cmd += ["--cpus", f"{spec.cpus:g}"]

    def bind(src: str, dst: str, writable: bool = False) -> list[str]:
        return ["--mount", f"type=bind,source={src},target={dst}" + ("" if writable else ",readonly")]

    if spec.image_mode:  # the image's own root: no host system directory, the wrapper on the runtime's python
        wrapped = wrapper(spec, ctl, argv)
        cmd += bind(str(ctl.dir), CONTROL)
        for m in ordered(spec.mounts):
            cmd += bind(str(m.host), m.inside, m.writable)
        cmd += bind(str(spec.app), spec.workdir, True) + bind(str(spec.home), HOME, True)
        image = owned_tag(spec.image) if writable else spec.image
        return [*cmd, "--entrypoint", wrapped[0], image, *wrapped[1:]]
    for path, link in system_entries():
        cmd += bind(os.path.realpath(path) if link is not None else path, path)
    for prefix in python_prefixes(venvs_of(spec)):
        cmd += bind(prefix, prefix)
    for m in spec.mounts:
        cmd += bind(str(m.host), m.inside, m.writable)
    cmd += bind(str(spec.app), APP, True) + bind(str(spec.home), HOME, True) + bind(str(ctl.dir), CONTROL)
    return [*cmd, spec.image, *wrapper(spec, ctl, argv)]


def remove_containers(run_id: str) -> int:
    """docker rm -f every container labelled polar-run=<run-id> (a dead attempt's); how many there were."""
    exe = shutil.which("docker")
    if not exe:
        return 0
    try:
        p = subprocess.run([exe, "ps", "-aq", "--filter", f"label=polar-run={run_id}"], capture_output=True,
                           text=True, timeout=30, stdin=subprocess.DEVNULL)
        ids = p.stdout.split() if p.returncode == 0 else []
        if ids:
            subprocess.run([exe, "rm", "-f", *ids], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        return len(ids)
    except (OSError, subprocess.TimeoutExpired):
        return 0


class Docker:
    kind = "docker"
    isolated = True
    runs_images = True
    exports_rootfs = False  # the daemon runs the image itself
    warm_slots = False
    labels_runs = True  # a container can outlive its runner: labelled with the run, removed by cleanup
    real_uid = True

    def available(self) -> str | None:
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

    def prepare(self, spec: SandboxSpec) -> None:
        for p in [str(spec.app), str(spec.home), *(str(m.host) for m in spec.mounts), *(m.inside for m in spec.mounts)]:
            if any(c in p for c in ',"\n'):
                raise SandboxError(f"docker cannot bind a path containing a comma, quote or newline: {p!r}")
        if shutil.which("docker") is None:
            raise SandboxError(self.available() or "docker is not installed")
        if not spec.image_mode:
            ensure_image(spec.image)
        elif spec.root_writable:
            ensure_owned(spec)

    def command(self, spec: SandboxSpec, ctl: ControlDir, argv: list[str], name: str):
        return docker_command(spec, ctl, argv, name), dict(os.environ), "/"

    def memory_limit(self, spec: SandboxSpec):
        if spec.memory_mb is None:
            return [], None, "none"
        return [], None, f"docker --memory {spec.memory_mb}m (swap included)"

    def kill(self, name: str) -> None:
        exe = shutil.which("docker") or "docker"
        for sub in (["kill", name], ["rm", "-f", name]):
            try:
                subprocess.run([exe, *sub], capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def cleanup(self, label: str) -> int:
        return remove_containers(label)


BACKEND = Docker()
