"""polar-proxy start|stop|status|env — run the Polar gateway (mitmdump with the addon) in the background.

start: free loopback port (or --port), waits until the addon answers its readiness probe, prints the lines to
`eval` (HTTPS_PROXY with the session as proxy user name, the CA variables; with --base-url each SDK's and CLI's
base-URL variable at the proxy's own address instead, the session in the path) and writes the run file proxy.json.
start --count N: a fleet of N proxy processes on N ports (free ones, or --port, --port+1, …), one CA and one flow
directory; each process names its own files, so they never share one. The run file keeps the first proxy's fields
at the top level and lists all of them under `proxies`, each with its control endpoints (`control_url`) and the
token file they require (`control_token`); `env --proxy K` prints the lines for proxy K.
stop: SIGTERM to every live proxy of the run file (flow files are closed and renamed on a clean shutdown).
status: the run file with, per proxy, whether it runs and answers ready (exit 1 unless all do).
start refuses (exit 2) while the run file names a live proxy; a run file whose pids are all dead is overwritten.
--upstream is one OpenAI base URL, a pool of replicas as comma-separated base URLs, or @FILE (one per line, blank
lines and # comments ignored); each must be http(s) and end in /v1, none listed twice.
Bad options fail up front with one line and exit 2; an upstream that does not answer GET /models within 2 s is a
one-line warning (vLLM may still be starting). The printed lines are shell-quoted, the session percent-encoded.
The CA directory: --confdir, else POLAR_CONFDIR, else a checkout's certs/, else $XDG_DATA_HOME/polar (or
~/.local/share/polar); a new CA is made there, 0700, when it has none.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from polar.launch import paths
from polar.launch import proxy as lib
from polar.records import uuid7
from polar.records.cliargs import OneLineParser


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog or lib.command(), description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("start", "stop", "status", "env"),
                        help="start: launch and print the lines to eval; stop: stop every proxy of the run file; "
                             "status: is each proxy running and ready; env: print the lines again (for another "
                             "session or proxy)")
    parser.add_argument("--port", type=int, default=0,
                        help="start: first port (with --count N: PORT … PORT+N-1) (default: free ports)")
    parser.add_argument("--count", type=int, default=1,
                        help="start: N proxy processes (a fleet), one flow directory (default: %(default)s)")
    parser.add_argument("--proxy", type=int, default=0, metavar="K",
                        help="env: the lines for proxy K of the fleet (default: %(default)s)")
    parser.add_argument("--base-url", action="store_true",
                        help="start, env: print the base-URL lines instead (ANTHROPIC_BASE_URL, OPENAI_BASE_URL, "
                             "GOOGLE_GEMINI_BASE_URL at this proxy's address, the session in their path; the proxy "
                             "variables unset; no CA needed) (default: the HTTPS_PROXY lines)")
    parser.add_argument("--listen-host", default="127.0.0.1",
                        help="start: address the proxies bind (default: %(default)s)")
    parser.add_argument("--upstream", default=os.environ.get("POLAR_UPSTREAM", "http://127.0.0.1:8000/v1"),
                        help="start: OpenAI base URL of vLLM/SGLang, ending in /v1; a pool of replicas as several "
                             "comma-separated (what polar-vllm start --replicas N prints) or @FILE (one per line) "
                             "(default: $POLAR_UPSTREAM if set, else http://127.0.0.1:8000/v1)")
    parser.add_argument("--flows", default=str(paths.flows_dir()),
                        help="start: flow directory (default: %(default)s)")
    parser.add_argument("--session",
                        help="start, env: session id, the proxy user name in HTTPS_PROXY (default: a new UUIDv7, "
                             "printed on stderr)")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE",
                        help="start: extra mitmproxy/addon option, repeatable (default: none)")
    parser.add_argument("--run-dir", default=str(paths.default_run_dir()),
                        help="where proxy.json, the CA bundle and the logs go (default: $POLAR_RUN_DIR, else the "
                             "checkout's .cache/run, else ~/.cache/polar/run; here %(default)s)")
    parser.add_argument("--confdir", default=None,
                        help="start: the CA directory, made 0700 with a new CA when it has none (default: "
                             "$POLAR_CONFDIR, else the checkout's certs/, else $XDG_DATA_HOME/polar or ~/.local/share/polar; "
                             f"here {paths.confdir()})")
    parser.add_argument("--mitmdump", default=None,
                        help="start: the mitmdump to run (default: $POLAR_MITMDUMP if set, else the one beside "
                             "this Python, else on PATH)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="start: seconds to wait for every proxy to answer ready (default: %(default)s)")
    parser.add_argument("--allow-fail-closed", action="store_true",
                        help="start: keep a proxy whose gateway failed to load running (it answers providers with "
                             "503) (default: off, such a start fails)")
    return parser


def _err(line: str) -> None:
    print(line, file=sys.stderr)


def start(args: argparse.Namespace, prog: str) -> int:
    started = lib.start(args.upstream, flows=args.flows, run_dir=args.run_dir, count=args.count, port=args.port,
                        listen_host=args.listen_host, sets=args.set or [], timeout=args.timeout,
                        allow_fail_closed=args.allow_fail_closed, confdir=args.confdir, mitmdump=args.mitmdump)
    for line in started.notes:
        _err(line)
    state, n = started.state, len(started.state.proxies)
    session = args.session or uuid7()
    if not args.session:
        _err(f"# session {session} (pass --session ID to choose one)")
    if n > 1:
        _err(f"# {n} proxies on ports {', '.join(str(p.port) for p in state.proxies)}, one CA, flows in "
             f"{state.flows}.\n# Spread agents over them: agent i uses proxy i mod {n}, each with its own session "
             f"id:\n#   eval \"$({prog} env --proxy $((i % {n})) --session \"$ID\")\"\n# The lines below are proxy "
             f"0's. The processor reads the one flow directory whatever wrote it.")
    print("\n".join(lines_for(args, state, session)))
    return 0


def lines_for(args: argparse.Namespace, state, session: str, proxy: int = 0) -> list[str]:
    return lib.base_url_env_lines(state, session, proxy) if args.base_url else lib.env_lines(state, session, proxy)


def stop(args: argparse.Namespace) -> int:
    stopped = lib.stop(args.run_dir)
    if not stopped.found:
        _err(f"no proxy running (no {stopped.path})")
        return 0
    for p, was_running in stopped.proxies:
        if was_running:
            _err(f"stopped proxy pid {p.pid} on port {p.port}")
        else:
            _err(f"proxy pid {p.pid} on port {p.port} was not running")
    return 0


def status(args: argparse.Namespace) -> int:
    path, state, rows = lib.status(args.run_dir)
    if state is None:
        _err(f"no proxy running (no {path})")
        return 1
    doc = state.to_dict()
    doc["proxies"] = [{**p, **{k: row[k] for k in ("running", "ready")}} for p, row in zip(doc["proxies"], rows)]
    print(json.dumps(doc, indent=1))
    return 0 if all(row["running"] and row["ready"] for row in rows) else 1


def env(args: argparse.Namespace) -> int:
    state = lib.env(args.run_dir, args.proxy)
    print("\n".join(lines_for(args, state, args.session or uuid7(), args.proxy)))
    return 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    prog = prog or lib.command()
    args = build_parser(prog).parse_args(argv)
    try:
        if args.action == "start":
            return start(args, prog)
        if args.action == "env":
            return env(args)
        if args.action == "status":
            return status(args)
        return stop(args)
    except lib.ProxyError as exc:
        for line in exc.lines:
            _err(line)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
