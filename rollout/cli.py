"""`polar-rollout TASKS... --agent AGENT --out RUN [options]`. Exit codes: 0 every sample has a final status and at
least one a reward; 1 none has a reward (or processing failed); 2 bad input or a preflight refused; 130 cancelled.
`polar-rollout serve DIR ...` is the long-lived rollout stage (rollout/serve.py)."""

from __future__ import annotations

import argparse
import os
import sys


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _environment_arguments(p: argparse.ArgumentParser) -> None:
    """Where a task runs: its own image (Dockerfile, docker_image), a mapped one, or one for every task."""
    p.add_argument("--image", metavar="IMAGE",
                   help="run every task in this image (a local reference; --image-map applies) instead of the "
                        "environment each task names (default: each task's own)")
    p.add_argument("--image-map", action="append", default=[], metavar="REF=LOCAL",
                   help="use the local image LOCAL wherever a task names REF (FROM lines, docker_image); repeatable; "
                        "@FILE reads one REF=LOCAL a line (scripts/setup --images writes .cache/images/image-map.txt)")
    p.add_argument("--build-network", choices=("none", "host"), default=None,
                   help="the network of a task's Dockerfile build: none, or host (RUN pip/apt reach the registries "
                        "this machine reaches — and its loopback services) (default: none)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
    p.add_argument("--out", "-o", required=True, metavar="RUN",
                   help="the run directory; absent or empty unless --resume (required)")
    p.add_argument("--samples", "-k", type=_positive_int, metavar="K", help="samples per task (default: 4)")
    p.add_argument("--parallel", type=_positive_int, metavar="N",
                   help=f"samples at once (default: the machine's cores, {os.cpu_count()})")
    p.add_argument("--sandbox", choices=("bwrap", "docker", "none"),
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
                        "it has none (default: $POLAR_CONFDIR, else the checkout's certs/)")
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
    from polar.rollout.options import Options

    return Options(
        tasks=list(args.tasks), agent=args.agent, out=args.out, samples=args.samples, parallel=args.parallel or 0,
        sandbox=args.sandbox, image=args.image, model=args.model, agent_timeout=args.agent_timeout,
        verify_timeout=args.verify_timeout, proxy_set=list(args.proxy_set), upstream=args.upstream,
        proxy_json=args.proxy_json, run_id=args.run_id, resume=args.resume, retry_infra=args.retry_infra or 0,
        no_process=args.no_process, process_opt=list(args.process_opt), sft_min_reward=args.sft_min_reward,
        skip_preflight=args.skip_preflight, engine=args.engine, ray_address=args.ray_address,
        progress=args.progress, confdir=args.confdir, npm_dir=args.npm_dir, warm_agents=args.warm_agents,
        connect=args.connect or "proxy", image_map=list(args.image_map), build_network=args.build_network)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # a task folder named serve is passed as ./serve
        from polar.rollout import serve

        return serve.main(argv[1:])
    args = parser().parse_args(argv)
    from polar.rollout import runner, warm

    try:
        return runner.main(options(args))
    except KeyboardInterrupt:
        print("polar-rollout: cancelled", file=sys.stderr)
        return 130
    finally:
        warm.close_all()


if __name__ == "__main__":
    sys.exit(main())
