"""The run's options (polar-rollout's command line as one object), which of them are the run's identity and which a
resumed run takes from run.json, and their checks."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from polar.rollout import agents as agentlib
from polar.rollout.common import UsageError
from polar.rollout.job import AgentSpec


@dataclass
class Options:
    tasks: list[str]
    agent: str
    out: str
    samples: int | None = None  # None: 4 (or the resumed run's)
    parallel: int = 0  # 0: the machine's cores
    sandbox: str | None = None  # None: bwrap (or the resumed run's)
    image: str | None = None
    model: str | None = None
    agent_timeout: float | None = None
    verify_timeout: float | None = None
    proxy_set: list[str] = field(default_factory=list)
    upstream: str | None = None
    proxy_json: str | None = None
    run_id: str | None = None
    resume: bool = False
    retry_infra: int = 0
    no_process: bool = False
    process_opt: list[str] = field(default_factory=list)
    sft_min_reward: float | None = None
    skip_preflight: bool = False
    engine: str | None = None  # None: local (or the resumed run's)
    ray_address: str | None = None
    progress: bool | None = None
    confdir: str | None = None  # None: polar.launch.paths.confdir (outside a checkout, $POLAR_CONFDIR)
    npm_dir: str | None = None  # None: polar.launch.paths.npm_dir (outside a checkout, $POLAR_NPM_DIR)
    warm_agents: bool = False  # python: agents in bwrap run in warm slots (rollout/warm.py)
    connect: str = "proxy"  # how agents reach the gateway: proxy (HTTPS_PROXY) or base-url (their base URL)
    image_map: list[str] = field(default_factory=list)  # --image-map REF=LOCAL / @FILE (rollout/image_refs.py)
    build_network: str | None = None  # None: none (or the resumed run's); host lets RUN steps reach the registries


# Options a resumed run must keep (its identity), and the ones it takes from run.json unless given again.
IDENTITY = ("tasks", "agent", "samples", "sandbox")
REUSED = ("parallel", "image", "model", "agent_timeout", "verify_timeout", "proxy_set", "upstream", "proxy_json",
          "retry_infra", "no_process", "process_opt", "sft_min_reward", "engine", "ray_address", "confdir", "npm_dir",
          "warm_agents", "connect", "image_map", "build_network")


def check_options(o: Options) -> AgentSpec:
    """Each option on its own and against the others (UsageError names the one that is wrong); the parsed --agent.
    Fills the defaults that depend on the machine (--parallel)."""
    if not o.tasks:
        raise UsageError("no TASKS given (task directories or folders holding them)")
    if not o.agent:
        raise UsageError("--agent is required (claude-code, codex, gemini-cli, qwen-code, pi[:provider] or "
                         "python:MODULE:FUNC)")
    agent = AgentSpec.parse(o.agent)
    if o.samples < 1:
        raise UsageError(f"--samples must be at least 1 (got {o.samples})")
    if o.parallel < 0:
        raise UsageError(f"--parallel must be at least 1 (got {o.parallel})")
    o.parallel = o.parallel or os.cpu_count() or 1
    if o.retry_infra < 0:
        raise UsageError(f"--retry-infra must be 0 or more (got {o.retry_infra})")
    for name in ("agent_timeout", "verify_timeout"):
        v = getattr(o, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number of seconds (got {v})")
    if o.sandbox not in ("bwrap", "docker", "none"):
        raise UsageError(f"--sandbox must be bwrap, docker or none (got {o.sandbox})")
    if o.image and o.sandbox == "none":
        raise UsageError("--image runs every task in that image: it needs --sandbox docker or --sandbox bwrap")
    o.build_network = o.build_network or "none"
    if o.build_network not in ("none", "host"):
        raise UsageError(f"--build-network must be none or host (got {o.build_network})")
    if o.warm_agents and (o.sandbox != "bwrap" or agent.kind != "python"):
        raise UsageError("--warm-agents applies to python: agents in --sandbox bwrap only")
    if o.warm_agents and o.engine == "ray":
        raise UsageError("--warm-agents needs --engine local (its slots live in the runner's process)")
    if o.connect not in ("proxy", "base-url"):
        raise UsageError(f"--connect must be proxy or base-url (got {o.connect})")
    if o.connect == "base-url" and agent.kind == "cli" and agentlib.base_url_refusal(agent.harness):
        raise UsageError(agentlib.base_url_refusal(agent.harness))
    if o.engine not in ("local", "ray"):
        raise UsageError(f"--engine must be local or ray (got {o.engine})")
    if o.ray_address and o.engine != "ray":
        raise UsageError("--ray-address needs --engine ray")
    if o.upstream and o.proxy_json:
        raise UsageError("pass one of --upstream URL (the runner starts its proxy) or --proxy-json FILE "
                         "(a running proxy), not both")
    if o.proxy_set and o.proxy_json:
        raise UsageError("--proxy-set applies to the proxy the runner starts (--upstream), not to a "
                         "--proxy-json proxy")
    check_proxy_sets(o.proxy_set, o.sandbox)
    return agent


def proxy_sets(sets: list[str], sandbox: str) -> list[str]:
    """The --proxy-set items of the proxy the runner (or the serve) starts, with its defaults added: exact mode
    (polar_exact=true: the data is for training, so the prompt the trainer rebuilds is the one the sampler saw;
    `--proxy-set polar_exact=false` turns it off) and, when sandboxed, polar_other_hosts=refuse."""
    names = {s.split("=", 1)[0].strip() for s in sets}
    out = list(sets)
    if "polar_exact" not in names:
        out.append("polar_exact=true")
    if sandbox != "none" and "polar_other_hosts" not in names:
        out.append("polar_other_hosts=refuse")
    return out


def check_proxy_sets(sets: list[str], sandbox: str) -> None:
    """--proxy-set NAME=VALUE items for the proxy the runner (or the serve) starts."""
    for item in sets:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--proxy-set {item!r}: expected NAME=VALUE")
        if name.strip() == "polar_other_hosts" and sandbox != "none" and value.strip() != "refuse":
            raise UsageError(f"--proxy-set {item}: sandboxed runs need polar_other_hosts=refuse (their one path "
                             f"out is the proxy, which must serve provider hosts only)")
        if name.strip() == "polar_flows":
            raise UsageError("--proxy-set polar_flows: the runner's proxy writes to RUN/flows")
