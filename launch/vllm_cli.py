"""polar-vllm start|stop|status|reload: a local vLLM OpenAI server for the gateway (also `scripts/vllm` in a checkout).

  start  [--model tiny|smollm2|DIR] [--port P] [--max-model-len N] [--logprobs-mode raw_logprobs|processed_logprobs]
         [--dtype bfloat16|float32] [--dev] [--name NAME] [--timeout S] [--run-file PATH] [--replicas N|auto]
         [--device D] [--tensor-parallel-size N] [--vllm-venv DIR] [--models-dir DIR] [-- VLLM_ARGS...]
  stop   [--run-file PATH] [--timeout S]
  status [--run-file PATH]
  reload --weights DIR --version V [--run-file F] [--proxy-json FILE...] [--drain-timeout S (60)] [--vllm-venv DIR]

`start … -- VLLM_ARGS` passes VLLM_ARGS to `vllm serve` unchanged, after its own flags (docs/own-vllm.md lists
those); `--tensor-parallel-size N` shards one server over N GPUs (a GPU build only).
`start` prints the base URL (`http://127.0.0.1:P/v1`, the only line on stdout) once /health answers and writes the
run file (default `<run dir>/vllm.json`); a run file naming a healthy server of the same kind is reused. The server
log is `<run dir>/vllm-<P>.log`. `--dtype float32` is what logprob verification needs; `--dev` opens vLLM's
weight-reload endpoints, which `reload` uses. `stop` stops the run file's server (SIGKILL after --timeout) and removes
the file. `status` prints the run file of a healthy server (exit 1 otherwise).
`start --replicas N` starts a pool: N servers of the same spec side by side, each on its own port (free ones, or
--port, --port+1, …) with its own log; on a GPU build each gets one CUDA device (CUDA_VISIBLE_DEVICES; `auto`: one
per visible device). It waits for all of them; if one fails, the others are stopped and the error is that replica's
log tail. The pool run file (at --run-file) lists every replica, each with its own run file beside it
(vllm.json → vllm.r0.json, vllm.r1.json, …), and `start` prints the pool as one line: the comma-separated base URLs,
what the gateway's polar_upstream (and polar-proxy --upstream) takes. `stop` stops every replica; `status` prints the
pool with each replica's health (exit 1 unless all are healthy); `reload` publishes to every replica.
`reload` publishes new weights (polar.launch.publish): it holds the proxies of the proxy run files (default: the run
directory's proxy.json if present), reloads, probes, releases them with V and prints one JSON line (version, dir,
seconds). Exit 0 done; 1 failed (the message says which weights are served); 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from polar.launch import publish as publishing
from polar.launch import vllm, vllm_args, vllm_pool
from polar.records.cliargs import OneLineParser


def parser(prog: str) -> argparse.ArgumentParser:
    p = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    default_run_file = str(vllm.default_run_file())

    s = sub.add_parser("start", help="start a server and wait for /health")
    vllm_args.add_start_arguments(s)

    t = sub.add_parser("stop", help="stop the server named in the run file (every replica of a pool)")
    t.add_argument("--run-file", default=default_run_file)
    t.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL (default 30)")

    u = sub.add_parser("status", help="print the run file when its server is healthy, a pool's with each replica's "
                                      "health (exit 1 otherwise)")
    u.add_argument("--run-file", default=default_run_file)

    r = sub.add_parser("reload", help="publish new weights to the running dev-mode server (every replica of a pool)")
    r.add_argument("--weights", required=True, help="model directory (config.json, *.safetensors) on this machine")
    r.add_argument("--version", required=True, help="the weight version records will carry from now on")
    r.add_argument("--run-file", default=default_run_file, help="the vLLM to reload (as for stop)")
    r.add_argument("--proxy-json", action="extend", nargs="+", metavar="FILE",
                   help="proxy run files whose proxies are held (default: the run directory's proxy.json if present)")
    r.add_argument("--drain-timeout", type=float, default=60.0,
                   help="seconds for in-flight generations to finish before the reload (default 60)")
    vllm_args.add_venv_argument(r)
    return p


def cmd_start(args: argparse.Namespace, extra: list[str]) -> int:
    spec = vllm.StartSpec.from_namespace(args, extra)
    info = vllm.start(spec) if spec.replicas == 1 else vllm.start_pool(spec)
    print(info.base_url, flush=True)  # a pool's: the comma-separated base URLs of its replicas
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    vllm.stop(args.run_file, args.timeout)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    pool = vllm.read_pool(args.run_file)
    if pool is not None:
        rows = vllm_pool.replica_health(pool)
        doc = pool.to_dict()
        doc["replicas"] = [{**replica.to_dict(), "pid": info.pid if info else None, "healthy": ok,
                            "weight_version": info.weight_version if info else None}
                           for replica, info, ok in rows]
        print(json.dumps(doc, indent=2))
        bad = [replica.base_url for replica, _, ok in rows if not ok]
        if bad:
            vllm.say(f"{len(bad)} of {len(rows)} replicas not healthy: {', '.join(map(str, bad))}")
        return 1 if bad else 0
    info = vllm.status(args.run_file)
    if info is None:
        vllm.say("not running")
        return 1
    print(json.dumps(info.to_dict(), indent=2))
    return 0


def cmd_reload(args: argparse.Namespace) -> int:
    done = publishing.publish([args.run_file], args.weights, args.version, proxies=args.proxy_json,
                              drain_timeout=args.drain_timeout, vllm_venv=args.vllm_venv)
    for problem in done.problems:
        vllm.say(f"ERROR: {problem}")
    vllm.say(f"serving {done.weights_dir} as weight_version {done.weight_version} (held {done.proxies_held} "
             f"proxies for {done.seconds['held']:.2f} s)")
    print(json.dumps(done.summary()), flush=True)
    return 1 if done.problems else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    prog = "polar-vllm" if os.path.basename(sys.argv[0]) == "polar-vllm" else vllm.command()
    p = parser(prog)
    args = p.parse_args(argv)
    if extra and args.command != "start":
        p.error("extra vLLM flags after -- are only for start")
    commands = {"start": lambda: cmd_start(args, extra), "stop": lambda: cmd_stop(args),
                "status": lambda: cmd_status(args), "reload": lambda: cmd_reload(args)}
    try:
        return commands[args.command]()
    except vllm.BadInput as e:
        vllm.say(f"ERROR: {e}")
        return 2
    except vllm.Fail as e:
        vllm.say(f"ERROR: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
