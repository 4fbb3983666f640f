"""`polar-rollout serve DIR --upstream URL [options]`: the rollout stage that keeps its services. One process starts
one proxy (its CA; polar_other_hosts=refuse when sandboxed), passes one preflight (the canary call, and the canary
sample of --agent), writes DIR/ready.json, then runs polar-rollout runs on request: each exactly as `polar-rollout`
would run it (the same RUN files: run.json, results.jsonl, rewards.jsonl, samples/, out/, summary.json), against this
proxy and without a preflight of its own (run.json records the serve's that passed; an agent the serve has not
preflighted gets its preflight in its first run). The files: rollout/serve/protocol.py (docs/contracts.md).

Concurrency: one thread per request in this process, each a Runner of its own (its RUN, its lock, its options, its
pool of sample threads), the samples of every run sharing --parallel slots: a sample starts as soon as one is free.
Threads rather than a process per request, because what the rollout keeps at module level is meant to be shared
or belongs to the main thread:
  CANCEL (rollout/common.py)   one flag per process: the serve sets it when it ends, and every run is cancelled
                               (130); nothing else sets it here (schedule.execute installs its SIGTERM handler in
                               the main thread only; the serve's main thread owns SIGTERM and SIGINT)
  flowwatch's counters         one per flow directory, locked, read on incrementally: the serve's growing flow
                               directory is skimmed once, where a new process would skim all of it again
  sandbox's image cache        locked

Each run speaks to a Reporter of its own (rollout/reporter.py) that writes to the request's log and keeps its errors:
the response's error is the run's last one, as data. A request reaches its Runner as Options: the request's fields,
with its extra_args parsed over them as polar-rollout parses its command line.

It ends on SIGTERM or SIGINT, on DIR/stop, when --parent-pid is gone, or when its proxy dies (exit 1): running runs
are cancelled, their sandboxes killed, the proxy stopped, ready.json removed, ended.json written. Exit codes: 0 asked
to end, 1 its proxy died, 2 bad input or a refused preflight (one line naming the fix)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from polar.launch import paths
from polar.launch import proxy as launch_proxy
from polar.records.cliargs import OneLineParser
from polar.rollout import options as rollout_options
from polar.rollout import proxyctl, turn_states
from polar.rollout.common import CANCEL, PREFLIGHT, UsageError, lock_dir, now, read_json
from polar.rollout.job import AgentSpec, SampleContext
from polar.rollout.options import check_proxy_sets, proxy_sets
from polar.rollout.preflight import canary_call, run_preflight
from polar.rollout.processing import run_processor
from polar.rollout.procs import is_alive, kill_children, stop_process_group
from polar.rollout.reporter import Reporter
from polar.rollout.runner import Runner
from polar.rollout.sandbox import registry, warm
from polar.rollout.serve import protocol as sp
from polar.rollout.serve import runflows

# Options that belong to the serve, not to one of its runs: a request naming one is refused (exit 2).
SERVE_OWNS = {"upstream": "--upstream", "proxy_json": "--proxy-json", "proxy_set": "--proxy-set",
              "confdir": "--confdir", "npm_dir": "--npm-dir", "skip_preflight": "--skip-preflight",
              "ray_address": "--ray-address"}
JOIN_S = 60.0  # after a cancel, how long the serve waits for its runs to write their cancelled lines


# ------------------------------------------------------------------------------------------------ one served run

class ServedRunner(Runner):
    """polar-rollout's Runner on the serve's proxy: no proxy of its own, the serve's preflight, the serve's slots,
    processing over RUN/flows (runflows.py)."""

    def __init__(self, opts, serve: Serve, report: Reporter):
        super().__init__(opts, report)
        self.serve = serve
        self.slots = serve.slots

    def _open_proxy(self) -> None:
        self.proxy = dataclasses.replace(self.serve.proxy, own=False)  # never stopped by a run
        self.run_doc["proxy"] = {**proxyctl.describe(self.proxy), "served_by": str(self.serve.dir)}
        self._save_run_doc()

    def _preflight(self) -> None:
        passed = self.serve.preflights.get(self.agent.text)
        if passed is None and self.serve.args.skip_preflight:  # no canary sample for any agent: the canary call's
            passed = self.serve.preflights[None]
        if passed is None:  # an agent the serve has not preflighted: its preflight, once, in this run
            super()._preflight()
            self.serve.preflights.setdefault(self.agent.text, self.run_doc["preflight"])
            return
        self.run_doc["preflight"] = {**passed, "served_by": str(self.serve.dir)}
        self._save_run_doc()

    def _process(self) -> dict:
        flows = runflows.link_flows(self.proxy.flows, self.run_dir / "flows", float(self.run_doc["created"]))
        return run_processor(self.run_dir, flows, self.run_doc["run_id"], [t.id for t in self.tasks],
                             self.opts.sft_min_reward, self.opts.process_opt, self.report)


# The request's fields that are polar-rollout's options of the same name (None: the option's default).
REQUEST_OPTIONS = ("agent", "samples", "parallel", "run_id", "agent_timeout", "verify_timeout", "model", "image",
                   "retry_infra", "sft_min_reward", "sandbox")


def _request_options(req: sp.RolloutRequest, serve: Serve):
    """The run's Options: the request's fields, its extra_args parsed over them as polar-rollout parses its command
    line (a flag there wins, as it would after them on a command line), with the serve's sandbox and npm directory;
    the serve's own options refused."""
    parser = rollout_options.parser(out_required=False)

    def refuse(message: str):
        raise UsageError(message)

    parser.error = refuse
    given = argparse.Namespace(out=req.out, resume=req.resume, no_process=req.no_process,
                               process_opt=list(req.process_opt))
    for name in REQUEST_OPTIONS:
        if getattr(req, name) is not None:
            setattr(given, name, getattr(req, name))
    try:
        args = parser.parse_args(list(req.extra_args), namespace=given)
    except SystemExit:  # --help or --version among extra_args: not a run
        raise UsageError("extra_args: --help is not a run") from None
    args.tasks = [*req.tasks, *(args.tasks or [])]
    given = [flag for name, flag in SERVE_OWNS.items() if getattr(args, name)]
    if given or args.engine == "ray":
        raise UsageError(f"{', '.join(given) or '--engine ray'}: the serve's, not a run's (it runs one proxy and "
                         f"local sample threads for every run); drop it from the request")
    if args.sandbox not in (None, serve.sandbox):
        raise UsageError(f"--sandbox {args.sandbox}: this serve runs --sandbox {serve.sandbox} (its proxy and "
                         f"preflight are for it); start a serve with --sandbox {args.sandbox}")
    mode = serve.args.turn_states
    if args.turn_states not in (None, mode):
        raise UsageError(f"--turn-states {args.turn_states}: this serve runs --turn-states {mode} (its proxy announces "
                         f"calls so, or not at all); start a serve with --turn-states {args.turn_states}")
    o = rollout_options.options(args)
    o.sandbox, o.npm_dir, o.confdir, o.progress = serve.sandbox, serve.args.npm_dir, serve.args.confdir, False
    o.turn_states = mode  # every run of a serve that snapshots has its samples snapshotted
    return o


def _failure(code: int, run: Path | None, run_error: str | None, reason: str | None) -> str | None:
    """The response's one line for a run that did not exit 0."""
    if code == 0:
        return None
    if code == 2:
        return run_error or "bad input (see the log)"
    if code == 130:
        return f"cancelled: the serve is ending ({reason or 'asked to'})"
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        doc = read_json(run / "summary.json")
        processed = doc.get("processed") or {}
        if processed.get("exit") not in (None, 0):
            return f"polar-process exit {processed['exit']} ({run / 'process.log'})"
        return f"no sample has a reward (statuses: {doc.get('statuses')})"
    return run_error or f"exit {code} (see the log)"


# ------------------------------------------------------------------------------------------------ the serve

class Serve:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.dir = Path(os.path.abspath(args.dir))
        self.sandbox = args.sandbox
        self.agent = AgentSpec.parse(args.agent) if args.agent else None
        self.slots = threading.BoundedSemaphore(args.parallel)
        self.proxy: proxyctl.Proxy | None = None
        self.turn_states: turn_states.TurnStates | None = None  # --turn-states async|hold: every run's announcements
        self.preflights: dict[str | None, dict] = {}  # None: the canary call alone (--skip-preflight)
        self.threads: dict[str, threading.Thread] = {}
        self.answered: set[str] = set()
        self.wake = threading.Event()
        self.signal: str | None = None
        self.reason: str | None = None
        self.starting = True
        self._lock_fd: int | None = None
        from polar.records import uuid7

        self.id = f"serve-{uuid7()}"  # its own sessions: <id>/preflight/0 and /1

    # -- start ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Check the input, take DIR, start the proxy, pass the preflight, write ready.json."""
        a = self.args
        if not a.upstream:
            raise UsageError("--upstream URL is required (an OpenAI /v1 base URL of vLLM or SGLang: the serve starts "
                             "its proxy in front of it)")
        if a.parent_pid is not None and not is_alive(a.parent_pid):
            raise UsageError(f"--parent-pid {a.parent_pid}: no such process")
        why = registry.available(self.sandbox)
        if why:
            raise UsageError(f"--sandbox {self.sandbox}: {why}")
        check_proxy_sets(a.proxy_set, self.sandbox)
        if a.turn_states != "off" and not registry.get(self.sandbox).isolated:
            raise UsageError(f"--turn-states {a.turn_states} needs a sandbox (--sandbox bwrap or docker): under "
                             f"--sandbox none the agent's workspace is not the serve's to snapshot")
        task = self._canary_task()
        for sub in (sp.REQUESTS, sp.RESPONSES, sp.LOGS):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._lock()
        for stale in (sp.READY, sp.ENDED, sp.STOP):
            (self.dir / stale).unlink(missing_ok=True)
        self.answered = {p.stem for p in (self.dir / sp.RESPONSES).glob("*.json")}
        sets = proxy_sets(a.proxy_set, self.sandbox)
        if a.turn_states != "off":  # one announce endpoint for every run: the proxy is told of it once
            self.turn_states, announce = turn_states.open_for_run(self.dir, a.turn_states)
            sets = [*sets, *announce]
        self.proxy = proxyctl.start_proxy(self.dir, a.upstream, sets, a.confdir)
        proxyctl.check_ready(self.proxy, registry.get(self.sandbox).isolated, None)
        preflight = self._preflight(task)
        p = self.proxy
        sp.write_json_atomic(self.dir / sp.READY, sp.Ready(
            pid=os.getpid(), pid_start=sp.pid_start(os.getpid()), port=p.port, proxy_pid=p.pid,
            proxy_json=str(paths.proxy_run_file(p.run_dir)), flows=p.flows, ca_pem=p.ca_pem, upstream=a.upstream,
            sandbox=self.sandbox, slots=a.parallel, preflight=preflight, started=now(),
            turn_states=a.turn_states).to_json())
        print(f"polar-rollout serve: ready in {self.dir} (pid {os.getpid()}, proxy port {p.port}, sandbox "
              f"{self.sandbox}, {a.parallel} sample slot(s))", file=sys.stderr)

    def _canary_task(self):
        from polar.rollout import tasks as tasklib

        if self.args.preflight_task:
            try:
                return tasklib.load_task(self.args.preflight_task)
            except tasklib.TaskError as exc:
                raise UsageError(f"--preflight-task: {exc}") from None
        return tasklib.Task(id=PREFLIGHT, path=self.dir, instruction="", agent_timeout_sec=None,
                            verifier_timeout_sec=None, cpus=None, memory_mb=None, workdir=None, tests_dir=self.dir,
                            solution_dir=None, agent_dir=None)

    def _lock(self) -> None:
        self._lock_fd = lock_dir(self.dir, f"another polar-rollout serve runs on {self.dir} (its lock is held); "
                                           f"stop it (touch {self.dir / sp.STOP}) or choose another DIR")

    def _preflight(self, task) -> dict:
        """The canary call; with --agent, its canary sample too (run_preflight): ready.json's `preflight`. With
        --skip-preflight the canary call only, for every agent (`canary_sample`: "skipped")."""
        if self.agent is None or self.args.skip_preflight:
            t0 = time.monotonic()
            canary_call(self.proxy, f"{self.id}/{PREFLIGHT}/0")
            doc = {"passed": True, "t": now(), "seconds": round(time.monotonic() - t0, 2), "agent": None}
            if self.args.skip_preflight:
                doc["canary_sample"] = "skipped (--skip-preflight)"
                self.preflights[None] = doc
            return doc
        doc = {**run_preflight(self.proxy, self._context(), task, self.dir, Reporter()), "agent": self.agent.text}
        self.preflights[self.agent.text] = doc
        return doc

    def _context(self) -> SampleContext:
        a, p = self.args, self.proxy
        npm = paths.npm_dir(a.npm_dir)
        if npm is None and self.agent.kind != "python" and registry.get(self.sandbox).isolated:
            raise UsageError(f"--agent {self.agent.text}: {paths.missing('npm_dir')}")
        return SampleContext(
            run_id=self.id, run_dir=str(self.dir), agent=self.agent, sandbox=self.sandbox,
            image=a.image or "polar-sandbox:1", model=None, proxy_port=p.port, ca_pem=p.ca_pem,
            ca_bundle=p.ca_bundle, flows=p.flows, venv=sys.prefix, npm_dir=str(npm or ""), agent_timeout=None,
            verify_timeout=None)

    # -- serving ------------------------------------------------------------------------------------------------
    def loop(self) -> int:
        """Take requests until something ends the serve; its exit code."""
        while True:
            code = self._why_end()
            if code is not None:
                return code
            for name in self._new_requests():
                thread = threading.Thread(target=self._serve_one, args=(name,), name=f"request-{name}", daemon=True)
                self.threads[name] = thread
                thread.start()
            for name in [n for n, t in self.threads.items() if not t.is_alive()]:
                del self.threads[name]
            self.wake.wait(sp.POLL_S)
            self.wake.clear()

    def _why_end(self) -> int | None:
        a, p = self.args, self.proxy
        if self.signal:
            self.reason = f"{self.signal} received"
        elif (self.dir / sp.STOP).exists():
            self.reason = f"asked to stop ({self.dir / sp.STOP})"
        elif a.parent_pid is not None and not is_alive(a.parent_pid):
            self.reason = f"its parent (pid {a.parent_pid}) is gone"
        elif p.pid is not None and p.pid not in launch_proxy.started_pids():
            self.reason = f"its proxy (pid {p.pid}) exited (log in {p.run_dir})"
            return 1
        return 0 if self.reason else None

    def _new_requests(self) -> list[str]:
        names = sorted(p.name[:-len(".json")] for p in (self.dir / sp.REQUESTS).glob("*.json")
                       if not p.name.startswith("."))
        fresh = [n for n in names if n not in self.answered and n not in self.threads]
        self.answered.update(fresh)
        return fresh

    def _serve_one(self, name: str) -> None:
        """One request, start to answer; never raises (a failure is the response's exit and error)."""
        t0, t_start = time.monotonic(), now()
        log, out, code, error = self.dir / sp.LOGS / f"{name}.log", None, 1, None
        try:
            req = sp.RolloutRequest.from_json(read_json(sp.request_path(self.dir, name)))
            log, out = Path(os.path.abspath(req.log)) if req.log else log, str(Path(os.path.abspath(req.out)))
        except (OSError, ValueError) as exc:
            code, error = 2, f"request {name}: {exc}"
        else:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a", encoding="utf-8", buffering=1) as fh:
                report = Reporter(err=fh, out=fh)
                bug = None
                try:
                    code = self._run(req, report)
                except UsageError as exc:
                    report.error(str(exc))
                    code = 2
                except KeyboardInterrupt:  # the cancel reached a preflight (preflight.canary_sample raises it)
                    report.note("cancelled")
                    code = 130
                except Exception as exc:  # noqa: BLE001 — a bug must not take the serve down: exit 1, traceback logged
                    report.exception()
                    code, bug = 1, f"serve: {type(exc).__name__}: {exc}"
                last = bug or (report.errors[-1] if report.errors else None)
                error = last if code == 1 and last else _failure(code, Path(out), last, self.reason)
        response = sp.RolloutResponse(name=name, exit=code, seconds=round(time.monotonic() - t0, 3), out=out,
                                      error=error, log=str(log), t_start=t_start, t_end=now())
        sp.write_json_atomic(sp.response_path(self.dir, name), response.to_json())
        print(f"polar-rollout serve: {name}: exit {code} in {response.seconds:.1f} s ({out})"
              + (f": {error}" if error else ""), file=sys.stderr)
        self.wake.set()

    def _run(self, req: sp.RolloutRequest, report: Reporter) -> int:
        if CANCEL.is_set():
            raise UsageError("the serve is ending; not started")
        report.line(f"$ polar-rollout {shlex.join(req.argv())}  # this request as a command line")
        return ServedRunner(_request_options(req, self), self, report).run()

    # -- the end ------------------------------------------------------------------------------------------------
    def stop(self, code: int) -> None:
        """Cancel the running runs, stop the proxy, then ready.json → ended.json."""
        (self.dir / sp.READY).unlink(missing_ok=True)
        CANCEL.set()
        kill_children(spare=launch_proxy.started_pids())  # every run's sandboxes and polar-process, the canary's
        deadline = time.monotonic() + JOIN_S
        for thread in list(self.threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        warm.close_all()
        proxyctl.stop_proxy(self.proxy)
        turn_states.close_for_run(self.turn_states)
        for pid in launch_proxy.started_pids():  # one started by a start cut short before it was ours
            stop_process_group(pid)
        (self.dir / sp.STOP).unlink(missing_ok=True)
        sp.write_json_atomic(self.dir / sp.ENDED, {"exit": code, "reason": self.reason, "pid": os.getpid(),
                                                    "t": now()})
        print(f"polar-rollout serve: ended ({self.reason})", file=sys.stderr)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="polar-rollout serve",
        description="The long-lived rollout stage: one proxy and one preflight, then polar-rollout runs on request "
                    "(DIR/requests/<name>.json → DIR/responses/<name>.json), several at once.",
        epilog="Files in DIR: ready.json, requests/, responses/, logs/, stop (touch it to end the serve), ended.json, "
               "proxy/ (the proxy's run file and log), flows/ (every run's flow records), preflight/. Exit codes: 0 "
               "asked to end (DIR/stop, SIGTERM, SIGINT, --parent-pid gone); 1 the proxy died; 2 bad input or "
               "preflight refused.")
    p.add_argument("dir", metavar="DIR", help="the serve's directory (made if absent)")
    p.add_argument("--upstream", metavar="URL", help="OpenAI /v1 base URL of vLLM or SGLang, or a pool of "
                                                     "replicas as comma-separated URLs or @FILE (required)")
    p.add_argument("--proxy-set", action="append", default=[], metavar="NAME=VALUE",
                   help="addon option for the serve's proxy, repeatable (default: polar_exact=true, and "
                        "polar_other_hosts=refuse when sandboxed; --proxy-set polar_exact=false for normal mode)")
    p.add_argument("--sandbox", choices=registry.kinds(), default="bwrap",
                   help="the sandbox of every run it serves (default: bwrap)")
    p.add_argument("--image", metavar="IMAGE", help="docker image of the preflight's canary sample")
    p.add_argument("--agent", metavar="AGENT",
                   help="the agent to preflight now (default: none; an agent's first run preflights it)")
    p.add_argument("--skip-preflight", action="store_true",
                   help="the canary call only: no canary sample, for --agent or any run's agent (default: off)")
    p.add_argument("--preflight-task", metavar="TASK",
                   help="the task whose limits and agent/ the canary sample uses (default: an empty one)")
    p.add_argument("--parallel", type=int, default=os.cpu_count() or 1, metavar="N",
                   help=f"samples at once across every run it serves (default: the machine's cores, "
                        f"{os.cpu_count()})")
    p.add_argument("--confdir", metavar="DIR", help="the proxy's CA directory (default: as polar-rollout's)")
    p.add_argument("--npm-dir", metavar="DIR", help="the agent CLIs' npm prefix (default: as polar-rollout's)")
    p.add_argument("--turn-states", choices=turn_states.MODES, default="off",
                   help="snapshot every run's samples' workspaces at their calls and score them with the tasks' "
                        "tests/progress.sh, as polar-rollout --turn-states does; a request may not ask another mode "
                        "(default: off)")
    p.add_argument("--parent-pid", type=int, metavar="PID", help="end when process PID is gone (default: never)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.parallel < 1:
        print(f"polar-rollout serve: error: --parallel must be at least 1 (got {args.parallel})", file=sys.stderr)
        return 2
    serve = Serve(args)

    def on_signal(signum, frame):
        serve.signal = signal.Signals(signum).name
        serve.wake.set()
        if serve.starting:  # the start (proxy, preflight) is cut short; `stop` cleans up what it had started
            raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    CANCEL.clear()
    code = 2
    try:
        serve.start()
        serve.starting = False
        code = serve.loop()
    except UsageError as exc:
        serve.reason = str(exc)
        print(f"polar-rollout serve: error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:  # a signal during the start (the preflight's canary sample)
        serve.reason, code = f"{serve.signal or 'SIGINT'} received while starting", 0
    finally:
        if serve._lock_fd is not None or launch_proxy.started_pids():
            serve.stop(code)
    return code
