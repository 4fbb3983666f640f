"""The run's options (polar-rollout's command line as one object), which of them are the run's identity and which a
resumed run takes from run.json, and their checks; polar-rollout's parser (`parser`) and the Options it gives
(`options`), which rollout/cli.py and the serve's requests (rollout/serve/server.py) both parse with."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field

from polar.records.cliargs import OneLineParser, positive_int
from polar.rollout import clis as agentlib
from polar.rollout import turn_states
from polar.rollout.common import UsageError
from polar.rollout.images import pull
from polar.rollout.job import AgentSpec
from polar.rollout.sandbox import registry


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
    warm_agents: bool = False  # python: agents in bwrap run in warm slots (rollout/sandbox/warm.py)
    connect: str = "proxy"  # how agents reach the gateway: proxy (HTTPS_PROXY) or base-url (their base URL)
    image_map: list[str] = field(default_factory=list)  # --image-map REF=LOCAL / @FILE (rollout/images/refs.py)
    build_network: str | None = None  # None: none (or the resumed run's); host lets RUN steps reach the registries
    turn_states: str | None = None  # None: off (or the resumed run's); async | hold: snapshots at calls (turn_states.py)
    reward_key: str | None = None  # None: reward (or the resumed run's): the key of reward.json a run trains on
    pull: str | None = None  # None: $POLAR_ROLLOUT_PULL, else missing (or the resumed run's) (images/pull.py)


# Options a resumed run must keep (its identity), and the ones it takes from run.json unless given again.
IDENTITY = ("tasks", "agent", "samples", "sandbox")
REUSED = ("parallel", "image", "model", "agent_timeout", "verify_timeout", "proxy_set", "upstream", "proxy_json",
          "retry_infra", "no_process", "process_opt", "sft_min_reward", "engine", "ray_address", "confdir", "npm_dir",
          "warm_agents", "connect", "image_map", "build_network", "turn_states", "reward_key", "pull")


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
    if o.sandbox not in registry.kinds():
        raise UsageError(f"--sandbox must be {registry.names()} (got {o.sandbox})")
    box = registry.get(o.sandbox)
    if o.image and not box.runs_images:
        raise UsageError("--image runs every task in that image: it needs --sandbox docker or --sandbox bwrap")
    o.build_network = o.build_network or "none"
    o.reward_key = o.reward_key or "reward"
    o.pull = o.pull or pull.default_policy()
    if o.pull not in pull.PULL_POLICIES:
        raise UsageError(f"--pull must be missing or never (got {o.pull})")
    if o.build_network not in ("none", "host"):
        raise UsageError(f"--build-network must be none or host (got {o.build_network})")
    if o.warm_agents and (not box.warm_slots or agent.kind != "python"):
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
    _check_turn_states(o, box)
    return agent


def _check_turn_states(o: Options, box) -> None:
    """--turn-states: the runner snapshots a sample's workspace when its calls arrive, so it needs the sandbox's
    working directory, its own proxy (which it tells where to announce calls) and the samples in its process."""
    o.turn_states = o.turn_states or "off"
    if o.turn_states not in turn_states.MODES:
        raise UsageError(f"--turn-states must be off, async or hold (got {o.turn_states})")
    if o.turn_states == "off":
        return
    if not box.isolated:
        raise UsageError(f"--turn-states {o.turn_states} needs a sandbox (--sandbox bwrap or docker): under --sandbox "
                         "none the agent's workspace is not the runner's to snapshot")
    if o.proxy_json:
        raise UsageError(f"--turn-states {o.turn_states} needs the proxy the runner starts (--upstream), which it tells "
                         "where to announce calls; a --proxy-json proxy cannot be told")
    if o.engine == "ray":
        raise UsageError(f"--turn-states {o.turn_states} needs --engine local (the snapshots are taken in the runner's "
                         "process)")
    if o.warm_agents:
        raise UsageError(f"--turn-states {o.turn_states} snapshots a sample's working directory where it runs, which a "
                         "warm slot moves into itself: pass --no-warm-agents")


def proxy_sets(sets: list[str], sandbox: str) -> list[str]:
    """The --proxy-set items of the proxy the runner (or the serve) starts, with its defaults added: exact mode
    (polar_exact=true: the data is for training, so the prompt the trainer rebuilds is the one the sampler saw;
    `--proxy-set polar_exact=false` turns it off) and, when sandboxed, polar_other_hosts=refuse."""
    names = {s.split("=", 1)[0].strip() for s in sets}
    out = list(sets)
    if "polar_exact" not in names:
        out.append("polar_exact=true")
    if registry.get(sandbox).isolated and "polar_other_hosts" not in names:
        out.append("polar_other_hosts=refuse")
    return out


def check_proxy_sets(sets: list[str], sandbox: str) -> None:
    """--proxy-set NAME=VALUE items for the proxy the runner (or the serve) starts."""
    for item in sets:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--proxy-set {item!r}: expected NAME=VALUE")
        if name.strip() == "polar_other_hosts" and registry.get(sandbox).isolated and value.strip() != "refuse":
            raise UsageError(f"--proxy-set {item}: sandboxed runs need polar_other_hosts=refuse (their one path "
                             f"out is the proxy, which must serve provider hosts only)")
        if name.strip() == "polar_flows":
            raise UsageError("--proxy-set polar_flows: the runner's proxy writes to RUN/flows")


# -- the command line ------------------------------------------------------------------------------------------------

def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _reward_key(text: str) -> str:
    if not text.strip() or text != text.strip():
        raise argparse.ArgumentTypeError(f"must name a key of reward.json, e.g. graded (got {text!r})")
    return text


def _turn_state_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turn-states", choices=turn_states.MODES, default=None,
                   help="snapshot each sample's working directory when its calls reach the gateway, and score the "
                        "main-chain calls' states with the task's tests/progress.sh (results.jsonl turn_scores, for "
                        "polar-process --credit turn): async = the call goes on at once (a fast answer acted on can "
                        "race the snapshot), hold = the call waits for its snapshot (at most 30 s); needs a sandbox "
                        "and --upstream (default: off)")


def _environment_arguments(p: argparse.ArgumentParser) -> None:
    """Where a task runs: its own image (Dockerfile, docker_image), a mapped one, or one for every task; and which
    of its grader's numbers is the reward."""
    p.add_argument("--reward-key", type=_reward_key, metavar="KEY",
                   help="the key of reward.json the run trains on, e.g. graded (a sample whose reward.json lacks it "
                        "is verifier_error) (default: reward, else reward.json's only key, else reward.txt)")
    p.add_argument("--image", metavar="IMAGE",
                   help="run every task in this image (a local reference; --image-map applies) instead of the "
                        "environment each task names (default: each task's own)")
    p.add_argument("--image-map", action="append", default=[], metavar="REF=LOCAL",
                   help="use the local image LOCAL wherever a task names REF (FROM lines, docker_image); repeatable; "
                        "@FILE reads one REF=LOCAL a line (scripts/setup --images writes .cache/images/image-map.txt)")
    p.add_argument("--build-network", choices=("none", "host"), default=None,
                   help="the network of a task's Dockerfile build: none, or host (RUN pip/apt reach the registries "
                        "this machine reaches — and its loopback services) (default: none)")
    p.add_argument("--pull", choices=pull.PULL_POLICIES, default=None,
                   help="an image or Dockerfile base that is neither mapped nor local: missing = the docker daemon "
                        "pulls it (its own credentials), never = the task's infra_error (default: "
                        f"${pull.PULL_ENV}, else missing)")


def parser(out_required: bool = True) -> argparse.ArgumentParser:
    """polar-rollout's parser (`out_required=False`: the serve's, whose requests carry --out as a field)."""
    p = OneLineParser(
        prog="polar-rollout",
        description="Run K samples of an unmodified agent on each Harbor task, each in a sandbox behind the Polar "
                    "proxy; verify them, write rewards and groups, and process the records into trainer batches.",
        epilog="Files in RUN: run.json, results.jsonl (one line per attempt), rewards.jsonl, samples/<task>/<k>/"
               "<attempt>/, flows/, out/ (polar-process), summary.json. Exit codes: 0 every sample has a final status "
               "and at least one has a reward; 1 none has; 2 bad input or preflight refused; 130 cancelled (Ctrl-C: "
               "records and results kept; continue with --resume).")
    p.add_argument("tasks", nargs="*", metavar="TASKS",
                   help="Harbor task directories (task.toml, instruction.md, tests/test.sh) or folders holding them "
                        "(required, except with --resume: the run's own)")
    p.add_argument("--agent", metavar="AGENT",
                   help="claude-code | codex | gemini-cli | qwen-code | pi[:anthropic|openai|google] | "
                        "python:MODULE:FUNC (required, except with --resume)")
    p.add_argument("--out", "-o", required=out_required, metavar="RUN",
                   help="the run directory; absent or empty unless --resume (required)")
    p.add_argument("--samples", "-k", type=positive_int, metavar="K", help="samples per task (default: 4)")
    p.add_argument("--parallel", type=positive_int, metavar="N",
                   help=f"samples at once (default: the machine's cores, {os.cpu_count()})")
    p.add_argument("--sandbox", choices=registry.kinds(),
                   help="bwrap | docker | none (none: on the host, rewards not isolation-safe) (default: bwrap)")
    _environment_arguments(p)
    p.add_argument("--model", metavar="M", help="model name passed to the CLI (default: the CLI's own)")
    p.add_argument("--agent-timeout", type=_seconds, metavar="S",
                   help="agent time limit, seconds (default: task.toml [agent] timeout_sec, else 600)")
    p.add_argument("--verify-timeout", type=_seconds, metavar="S",
                   help="verifier time limit, seconds (default: task.toml [verifier] timeout_sec, else 600)")
    p.add_argument("--proxy-set", action="append", default=[], metavar="NAME=VALUE",
                   help="addon option for the proxy the runner starts, repeatable (default: polar_exact=true — exact "
                        "mode, the data is for training — and polar_other_hosts=refuse when sandboxed; "
                        "--proxy-set polar_exact=false for normal mode)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--upstream", metavar="URL",
                     help="OpenAI /v1 base URL of vLLM or SGLang (a pool of replicas: several comma-separated, or "
                          "@FILE): the runner starts its own proxy, flows in RUN/flows")
    src.add_argument("--proxy-json", metavar="FILE",
                     help="a running proxy's run file (polar-proxy start) (default: the run dir's proxy.json if "
                          "present, else --upstream from its vllm.json; the run dir: $POLAR_RUN_DIR, else the "
                          "checkout's .cache/run)")
    p.add_argument("--confdir", metavar="DIR",
                   help="the CA directory of the proxy the runner starts (--upstream); a new CA is made there when "
                        "it has none (default: $POLAR_CONFDIR, else the checkout's certs/, else $XDG_DATA_HOME/polar or "
                        "~/.local/share/polar)")
    p.add_argument("--npm-dir", metavar="DIR",
                   help="the agent CLIs' npm prefix, DIR/node_modules/.bin (default: $POLAR_NPM_DIR, else the "
                        "checkout's .cache/npm; then PATH)")
    p.add_argument("--run-id", metavar="ID", help="the run id that starts every session (default: a new UUIDv7)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in RUN: rerun samples without a result, cancelled ones, and infra_error "
                        "ones up to --retry-infra (default: off)")
    p.add_argument("--retry-infra", type=int, metavar="N",
                   help="new attempts for a sample whose attempt ended infra_error (default: 0)")
    p.add_argument("--no-process", action="store_true", help="do not run polar-process at the end (default: off)")
    p.add_argument("--process-opt", action="append", default=[], metavar="ARG",
                   help="argument passed to polar-process, repeatable, e.g. --process-opt=--mode=per_request "
                        "(default: none)")
    p.add_argument("--sft-min-reward", type=float, metavar="X",
                   help="sft.jsonl keeps samples with reward ≥ X (default: every sample)")
    p.add_argument("--skip-preflight", action="store_true",
                   help="skip the canary call and the canary sample (default: off)")
    p.add_argument("--warm-agents", action=argparse.BooleanOptionalAction, default=False,
                   help="python: agents in bwrap: one sandbox per slot whose interpreter imported the agent and its "
                        "SDKs once, a fork of it per sample (docs/options.md says what samples of a slot share) "
                        "(default: off; polar-train turns it on for a python: agent in bwrap)")
    _turn_state_arguments(p)
    p.add_argument("--connect", choices=("proxy", "base-url"), default=None,
                   help="how agents reach the gateway: proxy (HTTPS_PROXY and our CA; every agent) or base-url (their "
                        "provider base URL set to the gateway's own address, plain HTTP through the sandbox relay, no "
                        "CA; python: agents on the SDKs, claude-code, qwen-code) (default: proxy)")
    p.add_argument("--engine", choices=("local", "ray"), help="local: threads; ray: one Ray task per sample "
                                                              "(one node) (default: local)")
    p.add_argument("--ray-address", metavar="A", help="Ray cluster to join (default: a local Ray)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: when stderr is a terminal; else one line per sample)")
    return p


def options(args: argparse.Namespace):
    """The run's Options from polar-rollout's parsed command line."""
    return Options(
        turn_states=args.turn_states,
        tasks=list(args.tasks), agent=args.agent, out=args.out, samples=args.samples, parallel=args.parallel or 0,
        sandbox=args.sandbox, image=args.image, model=args.model, agent_timeout=args.agent_timeout,
        verify_timeout=args.verify_timeout, proxy_set=list(args.proxy_set), upstream=args.upstream,
        proxy_json=args.proxy_json, run_id=args.run_id, resume=args.resume, retry_infra=args.retry_infra or 0,
        no_process=args.no_process, process_opt=list(args.process_opt), sft_min_reward=args.sft_min_reward,
        skip_preflight=args.skip_preflight, engine=args.engine, ray_address=args.ray_address,
        progress=args.progress, confdir=args.confdir, npm_dir=args.npm_dir, warm_agents=args.warm_agents,
        connect=args.connect or "proxy", image_map=list(args.image_map), build_network=args.build_network,
        reward_key=args.reward_key, pull=args.pull)
