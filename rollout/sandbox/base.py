"""The contract every sandbox backend fills (the `Sandbox` protocol) and what a caller hands one: the spec, its
mounts, the result, the one error. The view's fixed paths live here too, so a backend and the spec builder
(rollout/specs.py) name them once. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from polar.rollout.sandbox.cgroup import _Cgroup
    from polar.rollout.sandbox.control import ControlDir

UID = GID = 1000
APP = "/app"
HOME = "/home/agent"
RELAY_PORT = 18080
SYSTEM_PYTHON = "/usr/bin/python3"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_DIRS = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
DEFAULT_IMAGE = "polar-sandbox:1"


class SandboxError(RuntimeError):
    """The sandbox could not be set up or started: an infrastructure failure, never the agent's score."""


@dataclass(frozen=True)
class Mount:
    host: Path
    inside: str
    writable: bool = False


@dataclass(frozen=True)
class SandboxSpec:
    kind: str  # the backend's name (--sandbox)
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
    image_mode: bool = False  # the root is the image's own (docker: `image`; bwrap: `rootfs`), read-only but for
    #                           root_writable
    rootfs: Path | None = None  # an image's exported root filesystem (a backend that `exports_rootfs`)
    workdir: str = "/app"  # where `app` is mounted, the cwd (image mode: the image's WORKDIR)
    wrapper_python: str = SYSTEM_PYTHON  # the interpreter the wrapper runs on (image mode: the runtime's)
    tmp_mb: int | None = None  # the size of /tmp (task.toml storage_mb); None: the tmpfs default
    tripwire: bool = False  # no proxy: the relay answers 403 and counts the attempts (the verifier's)
    control_files: tuple[tuple[str, Path], ...] = ()  # (path under /run/polar, host file) copied into the control dir
    # `app` is the sandbox uid's already below its root (an overlay over a start state handed over once per run,
    # rollout/overlay.py): the hand-over changes only the root, instead of walking a repository-sized tree
    app_owned: bool = False
    # image mode: the root is writable through a layer of this sandbox's own, discarded with it (bwrap: `rootfs` is an
    # overlay view the runner mounted; docker: the container's layer, over the image with its directories the sandbox
    # uid's). What is mounted from the host stays read-only.
    root_writable: bool = False


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int | None  # None when timed out
    timed_out: bool
    wall_s: float
    memory_limit: str  # the limit in force, e.g. "cgroup v1 memory 2048 MiB", "prlimit --as 2048 MiB", "none"
    proxy_connections: int = 0  # connections the sandbox opened to the proxy (its relay's count)


class Sandbox(Protocol):
    """One backend (bwrap, docker, none, …): its facts, which callers ask instead of comparing names, and the four
    things only it knows how to do. Registered once (rollout/sandbox/registry.py); run by rollout/sandbox/run.py."""

    kind: str  # the name --sandbox takes
    isolated: bool  # the agent has its own view, network and uid 1000 (False: it runs on the host, as the runner)
    runs_images: bool  # a task's image can be the sandbox's root (image mode)
    exports_rootfs: bool  # an image runs from its root filesystem exported to a folder (`spec.rootfs`)
    warm_slots: bool  # --warm-agents: python: agents fork from a pre-imported interpreter in a slot of this backend
    labels_runs: bool  # what a run starts outlives its process, labelled with the run id (cleanup removes it)
    real_uid: bool  # uid 1000 inside is the host's uid 1000 (an engine's), not the caller mapped: as anyone but
    #                 root, the sample's writable folders are opened to all

    def available(self) -> str | None:
        """None when this backend can run sandboxes here, else one line saying why not (and the fix)."""

    def prepare(self, spec: SandboxSpec) -> None:
        """What must exist before the sandbox starts (an engine's base image); SandboxError when it cannot."""

    def command(self, spec: SandboxSpec, ctl: ControlDir, argv: list[str], name: str) -> tuple[list[str], dict[str, str], str]:
        """(argv, environment, cwd) of the host process that is the sandbox named `name`, running the wrapper."""

    def memory_limit(self, spec: SandboxSpec) -> tuple[list[str], _Cgroup | None, str]:
        """(argv prefix, the cgroup to clean up or None, the limit in force in SandboxResult.memory_limit's words)."""

    def kill(self, name: str) -> None:
        """Kill the sandbox `name` from outside, beyond its process group (an engine's container)."""

    def cleanup(self, label: str) -> int:
        """Remove what sandboxes labelled with run `label` left (a dead attempt's); how many there were."""
