"""Every sandbox a sample runs, specified in one place: the agent's (`agent_spec`: its argv, environment, mounts and
control files, for a CLI agent (rollout/clis.py) or a python: agent (polar.rollout.agents.pyagent with the runner's
venv)) and the verifier's (`verifier_spec`), isolated or on the host (a backend that is not `isolated`: --sandbox
none), in the host view or in the task's image.

In an image (the task's TaskEnv is in image mode, rollout/images/environments.py) nothing of the host's system is there:
the agent runs on the sandbox runtime (rollout/images/runtime.py, at /run/polar/rt) — a python: agent on its venv view
with the runner's site-packages mounted in it and the agents wing copied to /run/polar/lib, a CLI on its node with the
npm prefix at /run/polar/npm. The environment starts from the image's Env (its PATH is the agent's), then the task's
`[environment] env`, then ours."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from polar.records import protocols
from polar.rollout import clis as agentlib
from polar.rollout.common import proxy_url
from polar.rollout.images.runtime import INSIDE as RUNTIME_INSIDE, RuntimeBuildError, native_launcher, site_packages_of
from polar.rollout.job import SampleContext, SampleJob
from polar.rollout.sandbox import base as sb
from polar.rollout.sandbox import registry
from polar.rollout.sandbox.relay import CONNECT_VAR, RELAY_ADDRESS

# Paths inside the sandbox (the sandbox itself puts the sample's workdir at /app and HOME at /home/agent).
IN_VENV = "/opt/polar/venv"
IN_LIB = "/opt/polar/lib"
IN_AGENT_DIR = "/opt/polar/agent"
IN_NPM = "/opt/polar/npm"
IN_TESTS = "/tests"
IN_VERIFIER = "/logs/verifier"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# image mode: under the control directory, which every image has (the sandbox makes the mount points there)
IMAGE_LIB = "/run/polar/lib"
IMAGE_NPM = "/run/polar/npm"
IMAGE_AGENT_DIR = "/run/polar/agent"
# What a python: agent's sandbox gets of polar, (path under polar/, host file): the agents wing (its import budget is
# the standard library: rollout/agents/__init__.py), the two names users type and the protocols' standard-library
# leaf — never the rest of the repository.
ROLLOUT_DIR = Path(__file__).parent
AGENT_FILES = (*((f"rollout/{rel}", ROLLOUT_DIR / rel) for rel in (
    "agents/__init__.py", "agents/pyagent.py", "agents/sdk_agent.py", "pyagent.py", "sdk_agent.py")),
    ("records/protocols.py", Path(protocols.__file__)))
PYAGENT = "polar.rollout.agents.pyagent"
DEFAULT_VERIFY_TIMEOUT = 600.0


class AgentLaunch(NamedTuple):
    argv: list[str]
    env: dict[str, str]
    mounts: tuple
    control_files: tuple[tuple[str, Path], ...] = ()  # (path under /run/polar, host file): image mode


def base_env(ctx: SampleContext, job: SampleJob) -> dict[str, str]:
    """The start of a boxed process's environment: the image's Env (image mode) or ours, then the task's env."""
    tenv = task_env(ctx, job)
    if tenv is not None and tenv.image_mode:
        env = dict(tenv.env)
        env.setdefault("PATH", SANDBOX_PATH)
        env.setdefault("LANG", "C.UTF-8")
    else:
        env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    env.update(job.task.env or {})
    return env


def task_env(ctx: SampleContext, job: SampleJob):
    """The task's TaskEnv (rollout/images/environments.py), or None (the host view: no environment phase ran)."""
    envs = getattr(ctx, "envs", None) or {}
    return envs.get(job.task.id)

def host_env() -> dict[str, str]:
    """--sandbox none: the runner's environment minus what would move the agent off the proxy or out of its HOME."""
    drop = set(agentlib.DROP_VARS) | set(agentlib.HOME_VARS) | {
        "HTTPS_PROXY", "https_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
        "CODEX_CA_CERTIFICATE", "PYTHONPATH", "VIRTUAL_ENV", "POLAR_SESSION", "POLAR_SAMPLE"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def agent_command(ctx: SampleContext, job: SampleJob, session: str, app: Path, home: Path,
                  instruction: str) -> AgentLaunch:
    """(argv, env, mounts, control files) of the agent in the sample's sandbox."""
    boxed = registry.get(ctx.sandbox).isolated
    tenv = task_env(ctx, job)
    if boxed and tenv is not None and tenv.image_mode and not job.canary:
        return image_agent_command(ctx, job, session, home, instruction, tenv)
    home_in = sb.HOME if boxed else str(home)
    ca_pem, bundle = f"{home_in}/.polar/ca.pem", f"{home_in}/.polar/ca-bundle.pem"
    env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"} if boxed else host_env()
    if not job.canary:
        env.update(job.task.env or {})
    env.update({"TERM": "dumb", "NO_COLOR": "1", "CI": "1", "POLAR_SAMPLE": str(job.k), "POLAR_SESSION": session,
                "POLAR_RUN_ID": ctx.run_id, "POLAR_TASK": job.task.id, "POLAR_APP": sb.APP if boxed else str(app)})
    if job.canary:
        env["POLAR_PREFLIGHT"] = "1"
    if ctx.model:
        env["POLAR_MODEL"] = ctx.model
    if boxed:
        env["IS_SANDBOX"] = "1"  # Claude Code: --dangerously-skip-permissions is allowed in a sandbox
    proxy = proxy_url(ctx.proxy_port, session)  # the sandbox points HTTPS_PROXY at its relay instead
    mounts: list = []
    if ctx.agent.kind == "python":
        instr = home / ".polar" / "instruction.md"
        instr.write_text(instruction, encoding="utf-8")
        if boxed:
            mounts.append(sb.Mount(Path(ctx.venv), IN_VENV, False))
            for rel, host in AGENT_FILES:
                mounts.append(sb.Mount(host, f"{IN_LIB}/polar/{rel}", False))
            python = f"{IN_VENV}/bin/python"
            env["PATH"] = f"{IN_VENV}/bin:{SANDBOX_PATH}"
            env["PYTHONPATH"] = IN_LIB
            if job.task.agent_dir is not None:
                mounts.append(sb.Mount(Path(job.task.agent_dir), IN_AGENT_DIR, False))
                env["POLAR_AGENT_DIR"] = IN_AGENT_DIR
        else:
            python = str(Path(ctx.venv) / "bin" / "python")
            if job.task.agent_dir is not None:
                env["POLAR_AGENT_DIR"] = str(job.task.agent_dir)
        env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1",
                    "HTTPS_PROXY": proxy, "https_proxy": proxy, "SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle,
                    "NODE_EXTRA_CA_CERTS": ca_pem, "CODEX_CA_CERTIFICATE": bundle})
        env.pop("SSL_CERT_DIR", None)
        argv = [python, "-m", PYAGENT, ctx.agent.target or "",
                "--instruction-file", f"{home_in}/.polar/instruction.md"]
        return AgentLaunch(argv, connect_by(ctx, env), tuple(mounts))
    binary_name = agentlib.BINARIES[ctx.agent.harness]
    if boxed:
        mounts.append(sb.Mount(Path(ctx.npm_dir), IN_NPM, False))
        binary = f"{agentlib.npm_bin_dir(IN_NPM)}/{binary_name}"
        env["POLAR_NPM_DIR"] = IN_NPM
    else:
        binary = agentlib.find_binary(binary_name, ctx.npm_dir) or binary_name
    args = agentlib.cli_args(ctx.agent.harness, instruction, provider=ctx.agent.provider, model=ctx.model)
    argv, env = agentlib.build(args, env, proxy, ca_pem, bundle, session)
    return AgentLaunch([binary, *argv], connect_by(ctx, env), tuple(mounts))


def image_agent_command(ctx: SampleContext, job: SampleJob, session: str, home: Path, instruction: str,
                        tenv) -> AgentLaunch:
    """The agent in an image: on the sandbox runtime, in the image's environment (the module docstring)."""
    rt = ctx.runtime
    if rt is None:
        raise sb.SandboxError("no sandbox runtime was built for this run (an image task needs one)")
    ca_pem, bundle = f"{sb.HOME}/.polar/ca.pem", f"{sb.HOME}/.polar/ca-bundle.pem"
    env = base_env(ctx, job)
    env.update({"TERM": "dumb", "NO_COLOR": "1", "CI": "1", "POLAR_SAMPLE": str(job.k), "POLAR_SESSION": session,
                "POLAR_RUN_ID": ctx.run_id, "POLAR_TASK": job.task.id, "POLAR_APP": tenv.workdir,
                "IS_SANDBOX": "1"})
    if ctx.model:
        env["POLAR_MODEL"] = ctx.model
    proxy = proxy_url(ctx.proxy_port, session)
    mounts: list = [sb.Mount(Path(rt.root), RUNTIME_INSIDE, False)]
    if ctx.agent.kind == "python":
        (home / ".polar" / "instruction.md").write_text(instruction, encoding="utf-8")
        mounts.append(sb.Mount(site_packages_of(Path(ctx.venv)), rt.site_packages, False))
        files = tuple((f"lib/polar/{rel}", host) for rel, host in AGENT_FILES)
        if job.task.agent_dir is not None:
            mounts.append(sb.Mount(Path(job.task.agent_dir), IMAGE_AGENT_DIR, False))
            env["POLAR_AGENT_DIR"] = IMAGE_AGENT_DIR
        env.update({"PYTHONPATH": IMAGE_LIB, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                    "PYTHONNOUSERSITE": "1", "HTTPS_PROXY": proxy, "https_proxy": proxy, "SSL_CERT_FILE": bundle,
                    "REQUESTS_CA_BUNDLE": bundle, "NODE_EXTRA_CA_CERTS": ca_pem, "CODEX_CA_CERTIFICATE": bundle})
        env.pop("SSL_CERT_DIR", None)
        argv = [rt.venv_python, "-m", PYAGENT, ctx.agent.target or "",
                "--instruction-file", f"{sb.HOME}/.polar/instruction.md"]
        return AgentLaunch(argv, connect_by(ctx, env), tuple(mounts), files)
    if rt.node is None:
        raise sb.SandboxError("the sandbox runtime was built without node (a CLI agent needs it)")
    host_bin = agentlib.find_binary(agentlib.BINARIES[ctx.agent.harness], ctx.npm_dir)
    npm = os.path.realpath(ctx.npm_dir)
    script = os.path.realpath(host_bin) if host_bin else ""
    if not script.startswith(npm + os.sep):
        raise sb.SandboxError(f"the {ctx.agent.harness} CLI is not in the npm prefix {ctx.npm_dir} "
                              f"(scripts/setup --clis)")
    mounts.append(sb.Mount(Path(npm), IMAGE_NPM, False))
    env["POLAR_NPM_DIR"] = IMAGE_NPM
    args = agentlib.cli_args(ctx.agent.harness, instruction, provider=ctx.agent.provider, model=ctx.model)
    argv, env = agentlib.build(args, env, proxy, ca_pem, bundle, session)
    # node runs the CLI's script itself: its `#!/usr/bin/env node` would look for a node in the image; a CLI that
    # npm installs as a native executable runs on the runtime's loader and libraries instead
    try:
        launcher = native_launcher(rt, Path(script)) or [rt.node]
    except RuntimeBuildError as exc:
        raise sb.SandboxError(str(exc)) from None
    return AgentLaunch([*launcher, IMAGE_NPM + script[len(npm):], *argv], connect_by(ctx, env), tuple(mounts))


def connect_by(ctx: SampleContext, env: dict[str, str]) -> dict[str, str]:
    """--connect base-url: the base-URL variables at the sandbox relay's address (the wrapper fills it in), no proxy
    and no CA; the relay stamps the sample's session on every request as in proxy mode."""
    if getattr(ctx, "connect", "proxy") != "base-url":
        return env
    env = agentlib.base_url_env(env, RELAY_ADDRESS, None)
    env[CONNECT_VAR] = "base_url"
    return env


def image_fields(ctx, tenv, task) -> dict:
    """The SandboxSpec fields of an image task, only /tmp's size in the host view: the agent's sandbox and the
    verifier's take the same (`ctx` is the sample's SampleContext, `tenv` its TaskEnv or None, `task` its Task)."""
    if tenv is None or not tenv.image_mode or not registry.get(ctx.sandbox).runs_images:
        return {"tmp_mb": getattr(task, "storage_mb", None)}
    return {"image_mode": True, "image": tenv.image_id or tenv.image, "workdir": tenv.workdir,
            "rootfs": Path(tenv.rootfs) if tenv.rootfs else None, "wrapper_python": f"{RUNTIME_INSIDE}/bin/python3",
            "tmp_mb": getattr(task, "storage_mb", None)}


def agent_spec(ctx: SampleContext, job: SampleJob, session: str, app: Path, home: Path,
               instruction: str) -> tuple[sb.SandboxSpec, AgentLaunch]:
    """The agent's sandbox: its spec, and its launch (argv, env, mounts: what sample.json shows)."""
    launch = agent_command(ctx, job, session, app, home, instruction)
    tenv = None if job.canary else task_env(ctx, job)
    spec = sb.SandboxSpec(kind=ctx.sandbox, app=app, home=home, mounts=launch.mounts, env=launch.env,
                          proxy_port=ctx.proxy_port, session=session, memory_mb=job.task.memory_mb,
                          cpus=job.task.cpus, label=ctx.run_id, control_files=launch.control_files,
                          **{"image": ctx.image, **image_fields(ctx, tenv, job.task)})
    return spec, launch


def verifier_spec(ctx: SampleContext, job: SampleJob, vapp: Path, vhome: Path, vdir: Path,
                  script: str = "test.sh") -> tuple[sb.SandboxSpec, list[str], float]:
    """The verifier's sandbox over a copy of the final workdir (`vapp`): its spec, argv and timeout. No proxy: an
    isolated verifier's relay is a tripwire that answers 403 and counts the attempts. `script`: the tests' script
    it runs (tests/progress.sh for a turn state's score: rollout/turn_states.py)."""
    boxed = registry.get(ctx.sandbox).isolated
    tests = Path(job.task.tests_dir)
    tenv = task_env(ctx, job)
    image = boxed and tenv is not None and tenv.image_mode
    if boxed:
        env = base_env(ctx, job)
        env.update({"POLAR_APP": tenv.workdir if image else sb.APP, "POLAR_TESTS": IN_TESTS,
                    "POLAR_LOGS": IN_VERIFIER, "HOME": sb.HOME})
        mounts: tuple = (sb.Mount(tests, IN_TESTS, False), sb.Mount(vdir, IN_VERIFIER, True))
        if image:
            mounts = (sb.Mount(Path(ctx.runtime.root), RUNTIME_INSIDE, False), *mounts)
        argv = ["bash", f"{IN_TESTS}/{script}"]
    else:  # no mount namespace: the verifier finds its directories in these variables
        env = host_env()
        env.update({"POLAR_APP": str(vapp), "POLAR_TESTS": str(tests), "POLAR_LOGS": str(vdir),
                    "PATH": os.pathsep.join([str(Path(ctx.venv) / "bin"), env.get("PATH", SANDBOX_PATH)])})
        mounts = ()
        argv = ["bash", str(tests / script)]
    env.update({"POLAR_SAMPLE": str(job.k), "POLAR_TASK": job.task.id})
    timeout = ctx.verify_timeout or job.task.verifier_timeout_sec or DEFAULT_VERIFY_TIMEOUT
    spec = sb.SandboxSpec(kind=ctx.sandbox, app=vapp, home=vhome, mounts=mounts, env=env, proxy_port=None,
                          session=None, memory_mb=job.task.memory_mb, cpus=job.task.cpus, label=ctx.run_id,
                          tripwire=boxed, **{"image": ctx.image, **image_fields(ctx, tenv, job.task)})
    return spec, argv, timeout
