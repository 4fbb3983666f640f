"""The `none` backend: no sandbox. The agent runs on the host as the runner's user, in the sample's folders, with
the wrapper tied to the runner (relay.die_with: a subreaper that kills the agent's whole tree when the runner dies,
kill -9 included) and the relay on a free port of the host's loopback. For trusted agents and quick checks only."""

from __future__ import annotations

import os

from polar.rollout.sandbox.base import DEFAULT_PATH, SandboxSpec
from polar.rollout.sandbox.cgroup import limit_memory
from polar.rollout.sandbox.control import ControlDir
from polar.rollout.sandbox.view import wrapper


class NoSandbox:
    kind = "none"
    isolated = False
    runs_images = False
    exports_rootfs = False
    warm_slots = False
    labels_runs = False
    real_uid = False

    def available(self) -> str | None:
        return None

    def prepare(self, spec: SandboxSpec) -> None:
        pass

    def command(self, spec: SandboxSpec, ctl: ControlDir, argv: list[str], name: str):
        # no namespace or container ends the agent with the runner: the wrapper must (relay.die_with)
        return wrapper(spec, ctl, argv, ("--die-with", str(os.getpid()))), {"PATH": DEFAULT_PATH}, str(spec.app)

    def memory_limit(self, spec: SandboxSpec):
        return limit_memory(spec.memory_mb, spec.cpus)

    def kill(self, name: str) -> None:
        pass

    def cleanup(self, label: str) -> int:
        return 0


BACKEND = NoSandbox()
