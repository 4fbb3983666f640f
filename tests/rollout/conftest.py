"""Rollout fixtures. `dockerd` — a private Docker daemon for this test session (its own data root, exec root, pid
file and socket; `--bridge=none --iptables=false`, so it creates no network; overlay2 storage, else vfs),
DOCKER_HOST pointing at it, the sandbox image built locally; stopped at the end. When dockerd cannot start (not installed — `scripts/setup --system` —
not root, or it exits / does not answer) docker tests fail with the reason under CI=true and skip elsewhere."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

DOCKERD_WAIT_S = 60.0


def _docker(host: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "DOCKER_HOST": host}, stdin=subprocess.DEVNULL)


def _unmount_under(base: Path) -> None:
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(str(base) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


class DockerdUnavailable(Exception):
    """dockerd cannot start here; the message says why (the `dockerd` fixture fails or skips with it)."""


@contextlib.contextmanager
def private_dockerd():
    """A private dockerd for as long as the block runs (see the module docstring); yields its DOCKER_HOST, set in
    os.environ meanwhile. Raises DockerdUnavailable when it cannot start. scripts/bench_rollout uses it too."""
    exe = shutil.which("dockerd")
    if exe is None:
        raise DockerdUnavailable("dockerd is not installed (scripts/setup --system installs docker.io)")
    if shutil.which("docker") is None:
        raise DockerdUnavailable("the docker client is not installed (scripts/setup --system installs docker.io)")
    if os.geteuid() != 0:
        raise DockerdUnavailable("dockerd needs root to start")
    base = Path(tempfile.mkdtemp(prefix="polar-dockerd-"))  # short: Unix socket paths are limited to 107 bytes
    host = f"unix://{base}/docker.sock"
    log = open(base / "dockerd.log", "wb")

    def start(driver: str) -> subprocess.Popen:
        return subprocess.Popen(
            [exe, "--bridge=none", "--iptables=false", f"--storage-driver={driver}", "--data-root",
             str(base / f"data-{driver}"), "--exec-root", str(base / "exec"), "--pidfile", str(base / "docker.pid"),
             "-H", host, "--log-level=warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    # overlay2 where the filesystem takes it (image builds copy nothing per layer: ~15× faster than vfs for the
    # image tasks' builds); else vfs, which works on any filesystem (overlay2 on an overlay root does not)
    proc = start("overlay2")
    old = os.environ.get("DOCKER_HOST")
    try:
        try:
            _wait_for_dockerd(proc, host, base)
            driver = _docker(host, "info", "--format", "{{.Driver}}").stdout.strip()
        except DockerdUnavailable:
            driver = None
        if driver != "overlay2":
            _stop_dockerd(proc, host)
            _unmount_under(base)
            proc = start("vfs")
            _wait_for_dockerd(proc, host, base)
        os.environ["DOCKER_HOST"] = host
        from polar.rollout.sandbox.base import DEFAULT_IMAGE
        from polar.rollout.sandbox.docker import ensure_image

        ensure_image(DEFAULT_IMAGE)
        yield host
    finally:
        if old is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = old
        _stop_dockerd(proc, host)
        log.close()
        _unmount_under(base)
        shutil.rmtree(base, ignore_errors=True)


def _wait_for_dockerd(proc: subprocess.Popen, host: str, base: Path) -> None:
    deadline = time.monotonic() + DOCKERD_WAIT_S
    while True:
        if proc.poll() is not None:
            tail = (base / "dockerd.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise DockerdUnavailable(f"dockerd exited ({proc.returncode}) at start: {' | '.join(tail)}")
        try:
            if _docker(host, "version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            raise DockerdUnavailable(f"dockerd did not answer within {DOCKERD_WAIT_S:g} s")
        time.sleep(0.3)


def _stop_dockerd(proc: subprocess.Popen, host: str) -> None:
    if proc.poll() is not None:
        return
    try:
        ids = _docker(host, "ps", "-aq", timeout=15).stdout.split()
        if ids:
            _docker(host, "rm", "-f", *ids, timeout=30)
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def dockerd():
    """DOCKER_HOST of the private dockerd. CI installs docker.io and runs as root: there a dockerd that cannot start
    fails every docker test with its reason (tests/support/need.py); elsewhere they skip, naming the setup."""
    from tests.support.need import SYSTEM, need

    try:
        with private_dockerd() as host:
            yield host
    except DockerdUnavailable as e:  # raised at the start only, before the yield
        need(str(e), setup=SYSTEM)


@pytest.fixture(scope="session")
def images(dockerd, tmp_path_factory):
    """The stand-in bases (rollout/images/standins.py, `scripts/setup --images`) loaded into the private dockerd, and the
    --image-map file naming them."""
    from polar.rollout.images import standins
    from tests.support.need import IMAGES, need

    try:
        built = standins.build_standins()
    except standins.StandinError as exc:
        need(str(exc), setup=IMAGES)
    loaded = standins.load_standins(built)
    map_file = tmp_path_factory.mktemp("images") / "image-map.txt"
    map_file.write_text("\n".join(standins.image_map_lines(built)) + "\n")
    return {"map": map_file, "loaded": loaded, "host": dockerd}


@pytest.fixture(scope="session")
def cache_dir():
    """The images cache (.cache/images: the stand-ins, the runtime, the exports); the exports of this session's images
    (their ids are new in every private dockerd) are removed after the session."""
    from polar.launch import paths

    root = paths.images_dir()
    before = {d: set(os.listdir(root / d)) if (root / d).is_dir() else set() for d in ("rootfs", "workdirs")}
    yield root
    for d, names in before.items():
        for name in set(os.listdir(root / d)) - names if (root / d).is_dir() else ():
            subprocess.run(["rm", "-rf", str(root / d / name)], check=False)
