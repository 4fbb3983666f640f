"""The environment phase of a run: for each task, the image its samples run in — looked up, or built from its
Dockerfile — before the first sample, and what a sample needs of it (`TaskEnv`, picklable).

Rules.
1. The source of each task's environment is polar.rollout.images' `choose_environment` (rule 6 there: `--image`,
   then task.toml's `docker_image`, then `environment/Dockerfile`, then a one-service compose file, then
   `environment/workdir/`). A task whose source is `environment/workdir/` (or nothing) runs in the host view
   (rollout/sandbox/) as before; every other task runs in an image (mode "image"): bwrap or docker over the image's
   own root filesystem, read-only, with the sample's copy of the image's WORKDIR writable.
2. References are mapped with `--image-map` (a Dockerfile's FROM, ARG-named bases and `COPY --from` included, by
   polar.rollout.dockerfile; a named image by `ImageMap.lookup`). An image that is neither mapped nor in the local
   docker daemon is pulled by the daemon under `--pull missing` (rollout/images/pull.py); under `--pull never`, or
   when the pull fails (the registry's answer in the error), it is the task's error.
3. A Dockerfile is built by the local docker daemon, the task's `environment/` (or the compose file's context) as the
   build context, the rewritten Dockerfile on stdin, within `build_timeout_sec` (600 s by default), with
   `--network none` unless `--build-network host` (which lets `RUN pip/apt` reach the registries this machine
   reaches, and this machine's loopback services too). The proxy variables of the runner's environment are passed as
   build arguments (Docker predefines them). The image is tagged `polar-env/<task>:<key>`, key = `environment_key`
   (environment/, the rewritten Dockerfile, each base's image id): an existing tag is used without a build, so a
   second run builds nothing and a changed file in environment/ builds again. The log is RUN/builds/<task>.log.
4. A failure here (a build that fails or times out, an image that is not there, a Dockerfile or compose file we
   cannot use, an image task under --sandbox none) is the task's `error`: its samples end as `infra_error` with it,
   never with a reward, and the run goes on with the other tasks.
5. The working directory is the image's WORKDIR (/app when it sets none; / is refused). Its files are exported once
   per image id (images cache, `workdirs/<id>`) and copied per sample; under bwrap the whole root filesystem is
   exported once per image id (`rootfs/<id>`), with the mount points the sandbox uses made in it.
6. The image's `Env` is the base of the sample's environment (the task's `[environment] env` over it, the runner's
   variables over both); its `PATH` is the agent's PATH.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from polar.rollout.images import sources as imagelib
from polar.rollout.images.dockerfile import rewrite_dockerfile
from polar.rollout.images.pull import PullError
from polar.rollout.images.pull import pull as pull_image
from polar.rollout.images.refs import ImageError, ImageMap
from polar.rollout.sandbox import registry

DEFAULT_BUILD_TIMEOUT = 600.0
DEFAULT_WORKDIR = "/app"
BUILD_NETWORKS = ("none", "host")
PROXY_BUILD_ARGS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy",
                    "FTP_PROXY", "ftp_proxy", "ALL_PROXY", "all_proxy")
# made in an exported root filesystem, so bwrap can mount there over a read-only root (rollout/sandbox/)
MOUNT_POINTS = ("/run/polar", "/home/agent", "/tmp", "/proc", "/dev", "/tests", "/logs/verifier")
TAG_PART = re.compile(r"[^a-z0-9._-]+")
STANDIN_PREFIX = "polar-standin/"  # rollout/images/standins.py's local names


class EnvironmentError_(RuntimeError):
    """A task's environment could not be made; str() is one line naming the fix."""


@dataclass(frozen=True)
class TaskEnv:
    """What a task's samples run in (rule 1). Picklable: a Ray task gets it inside the SampleContext."""

    task: str
    mode: str  # "host" (the host view, environment/workdir/ in /app) or "image"
    source: str  # choose_environment's source, e.g. "environment/Dockerfile"
    named: str | None = None  # the image the task (or --image) names, before the map
    image: str | None = None  # what runs: a local reference (the build's tag, or the mapped name)
    image_id: str | None = None
    substitutions: tuple[tuple[str, str], ...] = ()  # (reference, local) the map applied
    workdir: str = DEFAULT_WORKDIR  # the sample's working directory, inside
    template: str | None = None  # host directory holding the WORKDIR's files (copied per sample)
    rootfs: str | None = None  # bwrap: the exported root filesystem
    env: tuple[tuple[str, str], ...] = ()  # the image's Env
    key: str | None = None  # environment_key of a built image
    built: bool = False  # this run built it (False: an existing tag was used)
    build_s: float = 0.0
    build_log: str | None = None
    notes: tuple[str, ...] = ()
    error: str | None = None

    @property
    def image_mode(self) -> bool:
        return self.mode == "image"

    def describe(self) -> dict:
        """run.json's and sample.json's account of it."""
        return {"mode": self.mode, "source": self.source, "named": self.named, "image": self.image,
                "image_id": self.image_id, "substituted": [list(s) for s in self.substitutions],
                "workdir": self.workdir if self.image_mode else None, "key": self.key, "built": self.built,
                "build_s": round(self.build_s, 3), "build_log": self.build_log, "notes": list(self.notes),
                "error": self.error}


@dataclass
class Docker:
    """The docker client against DOCKER_HOST (the runner's environment)."""

    exe: str = field(default_factory=lambda: shutil.which("docker") or "docker")

    def run(self, *args: str, input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self.exe, *args], input=input, capture_output=True, timeout=timeout,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise EnvironmentError_("the docker client is not installed (scripts/setup --system, or apt-get "
                                    "install docker.io)") from None
        except subprocess.TimeoutExpired:
            raise EnvironmentError_(f"docker {args[0]} did not answer within {timeout:g} s") from None

    def inspect(self, ref: str) -> dict | None:
        p = self.run("image", "inspect", ref)
        if p.returncode != 0:
            return None
        docs = json.loads(p.stdout or b"[]")
        return docs[0] if docs else None

    def local(self, ref: str) -> dict | None:
        """inspect(ref); a stand-in (`scripts/setup --images`) not yet in this daemon is loaded from its tarball."""
        info = self.inspect(ref)
        if info is None and ref.startswith(STANDIN_PREFIX):
            from polar.rollout.images import standins

            try:
                found = [s for s in standins.cached_standins() if s.local == ref]
                if found:
                    standins.load_standins(found, docker=self.exe)
                    info = self.inspect(ref)
            except standins.StandinError as exc:
                raise EnvironmentError_(f"{ref}: {exc}") from None
        return info

    def buildkit(self) -> bool:
        """Whether `docker build` here can use BuildKit (the buildx plugin answers)."""
        try:
            return self.run("buildx", "version", timeout=20).returncode == 0
        except EnvironmentError_:
            return False


def images_cache() -> Path:
    from polar.launch import paths

    return paths.images_dir()


# ---------------------------------------------------------------------------------------------------------------------
# the phase


@dataclass(frozen=True)
class PhaseOptions:
    image: str | None  # --image
    image_map: ImageMap
    build_network: str  # --build-network
    sandbox: str
    builds_dir: Path  # RUN/builds
    pull: str = "never"  # --pull: missing (the daemon pulls an image that is not local) or never


def prepare(tasks: list, opts: PhaseOptions, log=None) -> dict[str, TaskEnv]:
    """Rule 1–6 for every task, in order; never raises for one task's failure (its TaskEnv.error)."""
    log = log or (lambda line: print(f"polar-rollout: {line}", file=sys.stderr))
    docker = Docker()
    out: dict[str, TaskEnv] = {}
    buildkit: bool | None = None
    for task in tasks:
        try:
            choice = imagelib.choose_environment(task.path, task.docker_image, opts.image)
        except ImageError as exc:
            out[task.id] = TaskEnv(task.id, "image", "?", error=f"task {task.id}: {exc}")
            log(out[task.id].error)
            continue
        if choice.kind in ("workdir", "empty"):
            out[task.id] = TaskEnv(task.id, "host", choice.source, notes=choice.notes)
            continue
        if not registry.get(opts.sandbox).runs_images:
            out[task.id] = TaskEnv(task.id, "image", choice.source, notes=choice.notes,
                                   error=f"task {task.id}: its environment is an image ({choice.source}); run it "
                                         f"with --sandbox docker or --sandbox bwrap")
            log(out[task.id].error)
            continue
        try:
            if choice.kind == "build" and buildkit is None:
                buildkit = docker.buildkit()
            env = _image_env(task, choice, opts, docker, bool(buildkit), log)
        except (EnvironmentError_, ImageError) as exc:
            env = TaskEnv(task.id, "image", choice.source, notes=choice.notes, error=f"task {task.id}: {exc}")
            log(env.error)
        out[task.id] = env
    return out


def _image_env(task, choice, opts: PhaseOptions, docker: Docker, buildkit: bool, log) -> TaskEnv:
    subs: tuple[tuple[str, str], ...] = ()
    key = build_log = None
    built, build_s = False, 0.0
    if choice.kind == "image":
        named = choice.image
        local = opts.image_map.lookup(named) or named
        if local != named:
            subs = ((named, local),)
        info = _local_or_pulled(docker, named, local, opts.pull, log)
        image = local
    else:
        named = str(choice.dockerfile.relative_to(task.path)) if choice.dockerfile else choice.source
        image, info, key, built, build_s, build_log, subs = _build(task, choice, opts, docker, buildkit, log)
    config = info.get("Config") or {}
    workdir = (config.get("WorkingDir") or "").rstrip("/") or DEFAULT_WORKDIR
    if not workdir.startswith("/") or os.path.normpath(workdir) != workdir or workdir == "/":
        raise EnvironmentError_(f"the image's WORKDIR {workdir!r} cannot be the sample's working directory; set "
                                f"WORKDIR to a directory of its own (e.g. WORKDIR /app)")
    image_id = info["Id"]
    env = tuple(tuple(item.split("=", 1)) for item in (config.get("Env") or []) if "=" in item)
    template = None if choice.workdir is not None else str(export_workdir(docker, image_id, workdir))
    rootfs = str(export_rootfs(docker, image_id, workdir)) if registry.get(opts.sandbox).exports_rootfs else None
    return TaskEnv(task.id, "image", choice.source, named=named, image=image, image_id=image_id,
                   substitutions=subs, workdir=workdir, template=template, rootfs=rootfs, env=env, key=key,
                   built=built, build_s=build_s, build_log=build_log, notes=choice.notes)


def _missing(named: str, local: str) -> str:
    shown = named if named == local else f"{named} (mapped to {local})"
    return (f"image {shown} is not in the local docker daemon (--pull never): load it (docker load), pull it, or map "
            f"it with --image-map {named}=LOCAL (scripts/setup --images builds stand-ins)")


def _local_or_pulled(docker: Docker, named: str, local: str, policy: str, log) -> dict:
    """Rule 2: the local image's inspect document; under --pull missing one that is not local is pulled first."""
    info = docker.local(local)
    if info is None and policy == "missing":
        log(f"pulling {local} (--pull missing)")
        try:
            pull_image(docker.exe, local)
        except PullError as exc:
            raise EnvironmentError_(str(exc)) from None
        info = docker.inspect(local)
    if info is None:
        raise EnvironmentError_(_missing(named, local))
    return info


def _build(task, choice, opts: PhaseOptions, docker: Docker, buildkit: bool, log):
    """Rule 3: (tag, inspect doc, key, built, seconds, log path, substitutions)."""
    try:
        text = Path(choice.dockerfile).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvironmentError_(f"{choice.source}: cannot be read ({getattr(exc, 'strerror', None) or exc}); make "
                                f"it a readable UTF-8 file") from None
    rewritten = rewrite_dockerfile(text, opts.image_map, buildkit=buildkit)
    if rewritten.unresolved:
        base = rewritten.unresolved[0]
        raise EnvironmentError_(f"{choice.source} line {base.line}: the base image {base.text!r} cannot be resolved "
                                f"(an ARG without a default?); give the ARG a default")
    base_ids: dict[str, str] = {}
    for ref in [*rewritten.local_bases, *(b.text for b in rewritten.unmapped)]:
        original = next((s.original for s in rewritten.substitutions if s.local == ref), ref)
        base_ids[ref] = _local_or_pulled(docker, original, ref, opts.pull, log)["Id"]
    key = imagelib.environment_key(choice.context, rewritten.text, base_ids)
    tag = f"polar-env/{TAG_PART.sub('-', task.id.lower()).strip('.-_') or 'task'}:{key[:24]}"
    subs = tuple(dict.fromkeys((s.original, s.local) for s in rewritten.substitutions))
    info = docker.inspect(tag)
    opts.builds_dir.mkdir(parents=True, exist_ok=True)
    log_path = opts.builds_dir / f"{task.id}.log"
    if info is not None:
        return tag, info, key, False, 0.0, str(log_path) if log_path.exists() else None, subs
    timeout = task.build_timeout_sec or DEFAULT_BUILD_TIMEOUT
    log(f"task {task.id}: building {choice.source} as {tag} (--build-network {opts.build_network}, "
        f"timeout {timeout:g} s; log {log_path})")
    # no --label: the legacy builder adds a step (a layer) for it; the key is in the tag
    cmd = ["build", "--network", opts.build_network, "-t", tag, "-f", "-"]
    for name in PROXY_BUILD_ARGS:
        if os.environ.get(name):
            cmd += ["--build-arg", f"{name}={os.environ[name]}"]
    cmd.append(str(choice.context))
    env = {**os.environ, "DOCKER_BUILDKIT": "1" if buildkit else "0"}
    t0 = time.monotonic()
    with open(log_path, "wb") as fh:
        fh.write(f"# {' '.join(['docker', *cmd])}\n# substituted: {list(subs)}\n".encode())
        fh.flush()
        try:
            proc = subprocess.Popen([docker.exe, *cmd], stdin=subprocess.PIPE, stdout=fh, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        except OSError as exc:
            raise EnvironmentError_(f"docker build cannot start: {exc}") from None
        try:
            proc.communicate(rewritten.text.encode("utf-8", "surrogateescape"), timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, 9)
            proc.wait()
            raise EnvironmentError_(f"the build of {choice.source} did not finish within {timeout:g} s "
                                    f"(build_timeout_sec); last lines: {_last_lines(log_path)}; log {log_path}") \
                from None
    build_s = time.monotonic() - t0
    if proc.returncode != 0:
        hint = "" if opts.build_network == "host" else " (builds have no network unless --build-network host)"
        raise EnvironmentError_(f"the build of {choice.source} failed (exit {proc.returncode}){hint}; last lines: "
                                f"{_last_lines(log_path)}; log {log_path}")
    info = docker.inspect(tag)
    if info is None:
        raise EnvironmentError_(f"the build of {choice.source} succeeded but {tag} is not there; log {log_path}")
    log(f"task {task.id}: built {tag} in {build_s:.1f} s")
    return tag, info, key, True, build_s, str(log_path), subs


def _last_lines(path: Path, n: int = 4) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:])[-600:] or "(empty log)"


# ---------------------------------------------------------------------------------------------------------------------
# exports (rule 5), each once per image id, published by one rename


def _publish(target: Path, make) -> Path:
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name[:20]}-", dir=target.parent))
    try:
        make(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            _rmtree(tmp)
    return target


def _rmtree(path: Path) -> None:
    def onexc(func, p, _exc):  # an exported tree may hold read-only directories
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            func(p)

    shutil.rmtree(path, onexc=onexc)


def _container(docker: Docker, image_id: str):
    p = docker.run("create", "--network", "none", "--entrypoint", "/", image_id)
    if p.returncode != 0:
        raise EnvironmentError_(f"docker create {image_id[:19]}: {p.stderr.decode(errors='replace').strip()}")
    return p.stdout.decode().strip()


def _safe_extract(data: bytes, dest: Path, strip: str | None = None) -> None:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = []
        for m in tar.getmembers():
            name = m.name
            if strip is not None:
                if name == strip or name == strip + "/":
                    continue
                if not name.startswith(strip + "/"):
                    continue
                m.name = name[len(strip) + 1:]
            members.append(m)
        tar.extractall(dest, members=members, numeric_owner=True, filter="fully_trusted")


def export_workdir(docker: Docker, image_id: str, workdir: str) -> Path:
    """The files the image holds in `workdir` (nothing when it does not exist), once per (image id, workdir)."""
    name = f"{image_id.split(':')[-1][:32]}-{TAG_PART.sub('_', workdir.lower())[:40]}"
    target = images_cache() / "workdirs" / name

    def make(tmp: Path) -> None:
        cid = _container(docker, image_id)
        try:
            p = docker.run("cp", f"{cid}:{workdir}/.", "-", timeout=600)
            if p.returncode == 0:
                _safe_extract(p.stdout, tmp, strip=".")
            elif b"Could not find the file" not in p.stderr and b"No such" not in p.stderr:
                raise EnvironmentError_(f"docker cp of {workdir}: {p.stderr.decode(errors='replace').strip()}")
        finally:
            docker.run("rm", "-f", cid)
        os.chmod(tmp, 0o755)

    return _publish(target, make)


def export_rootfs(docker: Docker, image_id: str, workdir: str) -> Path:
    """The image's whole root filesystem (bwrap), with MOUNT_POINTS and `workdir` made, once per image id."""
    target = images_cache() / "rootfs" / f"{image_id.split(':')[-1][:32]}"

    def make(tmp: Path) -> None:
        cid = _container(docker, image_id)
        try:
            with tempfile.TemporaryFile(dir=tmp.parent) as fh:
                p = subprocess.run([docker.exe, "export", cid], stdout=fh, stderr=subprocess.PIPE, timeout=900,
                                   stdin=subprocess.DEVNULL)
                if p.returncode != 0:
                    raise EnvironmentError_(f"docker export {image_id[:19]}: "
                                            f"{p.stderr.decode(errors='replace').strip()}")
                fh.seek(0)
                with tarfile.open(fileobj=fh) as tar:
                    tar.extractall(tmp, numeric_owner=True, filter="fully_trusted")
        finally:
            docker.run("rm", "-f", cid)
        for point in (*MOUNT_POINTS, workdir):
            where = tmp / point.lstrip("/")
            if where.is_symlink() or (where.exists() and not where.is_dir()):
                raise EnvironmentError_(f"the image's {point} is not a directory; the sandbox mounts there")
            where.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o755)

    try:
        return _publish(target, make)
    except (OSError, tarfile.TarError) as exc:
        raise EnvironmentError_(f"cannot export the image's root filesystem: {exc}") from None
