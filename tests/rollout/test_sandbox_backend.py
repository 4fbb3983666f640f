"""A new sandbox backend costs one module: this one. `PidNamespace` fills the Sandbox protocol (rollout/sandbox/base.py)
— the agent and the verifier on the host like `none`, but each in a pid namespace of its own (util-linux `unshare`),
every command it is asked for recorded — and one `registry.register` call wires it: `polar-rollout --sandbox
pidns` then runs a real sample through it (the scripted upstream, the proxy, the verifier, polar-process), and
nothing else of the project names it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from polar.rollout import cli
from polar.rollout.sandbox import registry
from polar.rollout.sandbox.base import DEFAULT_PATH, SandboxSpec
from polar.rollout.sandbox.cgroup import limit_memory
from polar.rollout.sandbox.control import ControlDir
from polar.rollout.sandbox.view import wrapper
from tests.rollout.rollout_support import AGENT, make_task, results
from tests.support.need import SYSTEM, need

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class PidNamespace:
    kind = "pidns"
    isolated = False  # the host's files and network: a pid namespace is not isolation
    runs_images = False
    exports_rootfs = False
    warm_slots = False
    labels_runs = False
    real_uid = False

    def __init__(self):
        self.commands: list[list[str]] = []

    def available(self) -> str | None:
        return None if shutil.which("unshare") else "unshare (util-linux) is not installed"

    def prepare(self, spec: SandboxSpec) -> None:
        pass

    def command(self, spec: SandboxSpec, ctl: ControlDir, argv: list[str], name: str):
        # as root a pid namespace needs nothing else; anyone else maps itself to root in a user namespace first
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        cmd = [shutil.which("unshare") or "unshare", *user, "--pid", "--fork", "--kill-child", "--mount-proc",
               *wrapper(spec, ctl, argv)]
        self.commands.append(cmd)
        return cmd, {"PATH": DEFAULT_PATH}, str(spec.app)

    def memory_limit(self, spec: SandboxSpec):
        return limit_memory(spec.memory_mb, spec.cpus)

    def kill(self, name: str) -> None:
        pass  # its process group is the whole sandbox: --kill-child ends the namespace with unshare

    def cleanup(self, label: str) -> int:
        return 0


@pytest.fixture
def pidns():
    backend = PidNamespace()
    need(backend.available(), setup=SYSTEM)
    registry.register(backend)  # the one registration
    try:
        yield backend
    finally:
        registry.unregister(backend.kind)


def test_1_1_one_module_and_one_registration_run_a_real_sample(tmp_path, upstream, pidns, capsys):
    tasks = tmp_path / "tasks"
    make_task(tasks, "six-times-seven", "solve")
    run = tmp_path / "run"
    code = cli.main([str(tasks), "--agent", AGENT, "--out", str(run), "--sandbox", "pidns", "--upstream",
                     upstream.base_url, "--samples", "1", "--run-id", "seam"])
    err = capsys.readouterr().err
    assert code == 0, err
    [line] = results(run)
    assert (line["sandbox"], line["status"], line["reward"], line["calls"]) == ("pidns", "completed", 1.0, 1)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["isolation_safe"] is False and "warning" in summary  # the backend's fact, not its name
    # the canary sample, the agent's sandbox and the verifier's: each a command of this backend's, wrapping the agent
    argvs = [cmd[cmd.index("--") + 1:] for cmd in pidns.commands]
    assert len(argvs) == 3 and all(Path(cmd[0]).name == "unshare" and "--pid" in cmd for cmd in pidns.commands)
    assert argvs[1][1:3] == ["-m", "polar.rollout.agents.pyagent"] and argvs[2][:1] == ["bash"]
    assert "preflight passed" in err and "the pidns sandbox starts" in err


def test_1_2_nothing_else_of_the_project_names_it():
    """The backend is wired by its registration alone: no file of the package, the scripts or the docs names it."""
    named = [str(p.relative_to(ROOT)) for folder in ("rollout", "scripts", "docs") for p in (ROOT / folder).rglob("*")
             if p.is_file() and p.suffix in ("", ".py", ".md") and "pidns" in p.read_text(errors="replace")]
    assert named == []
