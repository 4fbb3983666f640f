"""The rollout stage of polar-train (docs/architecture.md#the-trainer-side): one `polar-rollout serve` for the whole
run, in the proxy's environment — one proxy, one CA, one preflight — and one request per step (and per held-out
evaluation) through its directory RUN/rollout (the protocol: polar.rollout.serve_protocol, standard library only,
the one module of the rollout side the trainer imports). Each request is a polar-rollout RUN, RUN/steps/000N (or
RUN/evals/000N); the trainer reads back what it wrote — run.json (whether processing succeeded) and results.jsonl
(the rewards). The two environments meet only through files and commands.

The serve's proxy lives across publications, so `proxies()` names its run file: publication holds it (in-flight
calls drained, new ones wait), and releases it with the new version, which every later record carries. Requests may
overlap training (--max-staleness): a step's samples may then be sampled by older versions."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from polar.records.results import read_latest
from polar.records import estimators
from polar.rollout import serve_protocol as protocol
from polar.trainer.plan import Plan, StageFailed, task_dirs, tasks_of_step

READY_TIMEOUT = 900.0  # the proxy's start and the preflight on a loaded machine (not a speed claim)


def step_dir(run: Path, step: int) -> Path:
    return run / "steps" / f"{step:04d}"


def version_of(step: int) -> str:
    return f"step-{step:04d}"


def version_index(version: str | None) -> int | None:
    """The number of one of polar-train's versions (step-000N → N); None for any other name."""
    if version and version.startswith("step-") and version[5:].isdigit():
        return int(version[5:])
    return None


def eval_dir(run: Path, step: int) -> Path:
    return run / "evals" / f"{step:04d}"


def split_opts(opts: list[str]) -> tuple[list[str], list[str]]:
    """--rollout-opt arguments → (the serve's, each run's)."""
    serve, each = [], []
    it = iter(opts)
    for opt in it:
        flag = opt.split("=", 1)[0]
        if flag in protocol.SERVE_FLAGS:
            serve.append(opt)
            if "=" not in opt and flag not in protocol.SERVE_SWITCHES:
                serve.append(next(it, ""))
        else:
            each.append(opt)
    return serve, each


@dataclass
class Started:
    """A step's requests in flight: the step's own and, on evaluation steps, the held-out one."""

    step: int
    name: str
    eval_name: str | None
    t0: float


@dataclass(frozen=True)
class ServeSettings:
    """What the serve and each of its runs need to know of a training run (a `Plan` has these too): the agent, the
    model directory (its tokenizer names the end-of-turn ids when a run is processed), the proxy's sampling
    override, the polar-rollout command line, the extra polar-rollout arguments and the processing's advantage
    normalisation (polar-process --advantage-norm)."""

    agent: str
    model: str
    sampling: str
    rollout_cmd: str
    rollout_opt: tuple[str, ...] = ()
    advantage_norm: str = "std"


class RolloutService:
    """`polar-rollout serve RUN/rollout` for the run: `start()` once (or `attach()` from another process of the same
    run), `submit(step)` per step and `finish(started)` for its results (polar-train), or `ask(...)`/`answer(...)`
    for any run, `stop()` at the end (it also ends by itself when this process is gone: --parent-pid). `plan` is a
    `Plan` or a `ServeSettings`: only their shared fields are read outside submit/finish."""

    def __init__(self, plan: Plan | ServeSettings, run: Path, url: str, directory: Path | None = None):
        self.plan, self.run, self.url = plan, run, url
        self.dir = Path(directory) if directory is not None else run / "rollout"
        self.proc: subprocess.Popen | None = None
        self.ready: protocol.Ready | None = None
        self.each_run: list[str] = split_opts(list(plan.rollout_opt))[1]

    def command(self) -> list[str]:
        serve_opts = split_opts(list(self.plan.rollout_opt))[0]
        return [*shlex.split(self.plan.rollout_cmd), "serve", str(self.dir), "--upstream", self.url,
                "--agent", self.plan.agent, "--parent-pid", str(os.getpid()),
                "--proxy-set", "polar_exact=true", "--proxy-set", f"polar_sampling_override={self.plan.sampling}",
                *serve_opts]

    def start(self) -> protocol.Ready:
        self._end_earlier_serve()
        for stale in (protocol.READY, protocol.ENDED, protocol.STOP):  # --resume: an earlier serve's files
            (self.dir / stale).unlink(missing_ok=True)
        for req in (self.dir / protocol.REQUESTS).glob("*.json"):  # asked by a trainer that is gone: asked again
            if not protocol.response_path(self.dir, req.stem).exists():
                req.unlink()
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("HTTPS_PROXY", "https_proxy", "VIRTUAL_ENV")}
        cmd = self.command()
        with open(self.dir / "serve.log", "a", encoding="utf-8") as log:
            log.write(f"$ {shlex.join(cmd)}\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self.ready = protocol.wait_ready(self.dir, READY_TIMEOUT, pid=self.proc.pid)
        except (protocol.ServeEnded, TimeoutError) as exc:
            self.stop()
            raise StageFailed(0, "rollout serve", f"{exc} (log: {self.dir}/serve.log)") from None
        return self.ready

    def attach(self, timeout: float = READY_TIMEOUT) -> protocol.Ready:
        """Use the serve another process of this run started (`start()`): wait until it is ready."""
        try:
            self.ready = protocol.wait_ready(self.dir, timeout)
        except (protocol.ServeEnded, TimeoutError) as exc:
            raise StageFailed(0, "rollout serve", f"{exc} (log: {self.dir}/serve.log)") from None
        return self.ready

    def _end_earlier_serve(self) -> None:
        """--resume after a kill: the serve of the killed trainer ends by itself (--parent-pid) but holds DIR until
        it has cancelled its runs; ask it to end now and wait for it."""
        try:
            doc = json.loads((self.dir / protocol.READY).read_text())
        except (OSError, ValueError):
            return
        pid = doc.get("pid") if isinstance(doc, dict) else None
        if isinstance(pid, int) and protocol.pid_start(pid) is not None and protocol.pid_start(pid) == doc.get(
                "pid_start"):
            protocol.request_stop(self.dir)
            deadline = time.monotonic() + READY_TIMEOUT
            while protocol.pid_start(pid) is not None and time.monotonic() < deadline:
                time.sleep(protocol.POLL_S)

    def proxies(self) -> list[str]:
        """The run files of the proxies a publication must hold: the serve's."""
        return [self.ready.proxy_json] if self.ready is not None else []

    def _request(self, out: Path, tasks: list[str], samples: int, run_id: str, process: bool) -> protocol.RolloutRequest:
        if (out / "run.json").is_file():  # a step cut short: continue it, finished samples kept
            return protocol.RolloutRequest(out=str(out), resume=True, log=str(out.with_suffix(".log")))
        # the model's own tokenizer names its end-of-turn ids: a step whose completions all ran into max_tokens (a
        # random policy's) has no natural stop to take them from
        return protocol.RolloutRequest(
            out=str(out), tasks=tuple(tasks), agent=self.plan.agent, samples=samples, run_id=run_id,
            no_process=not process, process_opt=(f"--tokenizer={self.plan.model}",
                                                  f"--advantage-norm={self.plan.advantage_norm}") if process else (),
            extra_args=tuple(self.run_args()), log=str(out.with_suffix(".log")))

    def run_args(self) -> list[str]:
        """Each run's polar-rollout arguments: --rollout-opt's, and --warm-agents for a python: agent in bwrap
        unless --rollout-opt says --[no-]warm-agents or turns --turn-states on (a step's samples then pay no SDK import:
        rollout/sandbox/warm.py)."""
        args = list(self.each_run)
        said = any(a.split("=", 1)[0] in ("--warm-agents", "--no-warm-agents") for a in args)
        if not said and self.plan.agent.startswith("python:") and self.ready is not None \
                and self.ready.sandbox == "bwrap" and not self.turn_states():
            args.append("--warm-agents")
        return args

    def turn_states(self) -> bool:
        """Whether the serve snapshots samples at their calls (its ready.json says, from its --turn-states): its
        samples then run in sandboxes of their own, not warm slots, which move the working directory away."""
        return self.ready is not None and (self.ready.turn_states or "off") != "off"

    def submit(self, step: int, evaluate: bool = False) -> Started:
        """Ask for step `step`'s rollout (and, with `evaluate`, the held-out tasks' beside it: no update follows
        from those)."""
        plan, run = self.plan, self.run
        t0 = time.monotonic()
        name = self.ask(step_dir(run, step), tasks_of_step(plan, step), plan.samples, f"{run.name}-{version_of(step)}",
                        f"step-{step:04d}")
        eval_name = None
        if evaluate:
            eval_name = self.ask(eval_dir(run, step), task_dirs(plan.eval_tasks), plan.eval_samples,
                                 f"{run.name}-eval-{step:04d}", f"eval-{step:04d}", process=False)
        return Started(step, name, eval_name, t0)

    def ask(self, out: Path, tasks: list[str], samples: int, run_id: str, name: str, process: bool = True) -> str:
        """Ask the serve for one polar-rollout run into `out` (continued when `out` holds one cut short); the
        request's name (`name`, or a fresh variant of it)."""
        out.parent.mkdir(parents=True, exist_ok=True)
        return protocol.submit(self.dir, self._request(out, tasks, samples, run_id, process),
                               name=_fresh(self.dir, name))

    def answer(self, name: str, out: Path, step: int = 0, stage: str = "rollout",
               unrewarded_ok: bool = False) -> tuple[dict, float]:
        """(the run's run.json, seconds from its request to its answer) once the serve answered `name`; a run that
        failed, or whose processing failed, is StageFailed naming `step` and `stage`. `unrewarded_ok`: a run whose
        samples all ended without a reward (polar-rollout's exit 1 after a processing that succeeded) is an answer
        too (a trainer that leaves unrewarded samples out of its baseline, as TRL does)."""
        answer = self._wait(step, name, stage)
        if unrewarded_ok and answer.exit == 1 and _unrewarded(out):
            answer = dataclasses.replace(answer, exit=0)
        if answer.exit != 0 or not (out / "run.json").is_file():
            raise StageFailed(step, stage, f"polar-rollout exit {answer.exit}: {answer.error or 'see its log'} "
                                           f"(log: {answer.log})")
        doc = json.loads((out / "run.json").read_text())
        processed = doc.get("processed") or {}
        if processed.get("exit") != 0 or not (out / "out" / "batches").is_dir():
            raise StageFailed(step, "process", f"polar-process exit {processed.get('exit')} ({out}/process.log)")
        return doc, answer.seconds

    def finish(self, started: Started) -> tuple[dict, float, dict | None]:
        """(the step's run.json, seconds from its request to its answer, the evaluation's rewards or None)."""
        step, run = started.step, self.run
        doc, seconds = self.answer(started.name, step_dir(run, step), step)
        evaluation = None
        if started.eval_name is not None:
            ev = self._wait(step, started.eval_name, "evaluation")
            if ev.exit != 0 or not (eval_dir(run, step) / "results.jsonl").is_file():
                raise StageFailed(step, "evaluation", f"polar-rollout exit {ev.exit}: {ev.error or 'see its log'} "
                                                      f"(log: {ev.log})")
            evaluation = rewards_of(eval_dir(run, step))
        return doc, seconds, evaluation

    def _wait(self, step: int, name: str, stage: str) -> protocol.RolloutResponse:
        try:
            return protocol.wait(self.dir, name)
        except protocol.ServeEnded as exc:
            raise StageFailed(step, stage, f"{exc} (log: {self.dir}/serve.log)") from None

    def stop(self) -> None:
        """End the serve (its proxy with it) and wait for it; kill it if it does not end."""
        if self.proc is None or self.proc.poll() is not None:
            return
        protocol.request_stop(self.dir)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def _unrewarded(out: Path) -> bool:
    """The run ended whole, its processing succeeded, and no sample has a reward."""
    try:
        doc = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("rewarded") == 0 and not doc.get("cancelled") \
        and (doc.get("processed") or {}).get("exit") == 0


def _fresh(directory: Path, base: str) -> str:
    """A request name not used yet in `directory` (a resumed step asks again under a new name)."""
    name, n = base, 1
    while protocol.request_path(directory, name).exists() or protocol.response_path(directory, name).exists():
        n += 1
        name = f"{base}.{n}"
    return name


def rewards_of(out: Path) -> dict:
    """The step's results.jsonl (latest attempts): samples, statuses, reward_mean, reward_std (over every rewarded
    sample), reward_mean_per_group, groups, groups_without_spread (fewer than 2 rewards, or all equal: every
    advantage of the group is 0), pass_at_1 (polar.records.estimators: the mean over tasks of each task's resolved
    share; samples without a reward left out)."""
    latest = read_latest(out / "results.jsonl")  # the ledger's rule: a sample's highest attempt
    statuses: dict[str, int] = {}
    groups: dict[str, list[float]] = {}
    outcomes: dict[str, list[bool | None]] = {}
    for doc in latest.values():
        statuses[doc["status"]] = statuses.get(doc["status"], 0) + 1
        reward = doc.get("reward")
        if reward is not None:
            groups.setdefault(doc["group"], []).append(float(reward))
        outcomes.setdefault(doc["task"], []).append(
            None if reward is None else estimators.is_resolved(float(reward), doc.get("reward_details")))
    every = [r for rs in groups.values() for r in rs]
    per_group = {g: sum(rs) / len(rs) for g, rs in sorted(groups.items())}
    mean = sum(every) / len(every) if every else None
    std = (sum((r - mean) ** 2 for r in every) / len(every)) ** 0.5 if every else None
    flat = sum(1 for rs in groups.values() if len(rs) < 2 or max(rs) - min(rs) <= 1e-12)
    return {"samples": len(latest), "statuses": statuses, "reward_mean": mean, "reward_std": std,
            "reward_mean_per_group": per_group, "groups": len(groups), "groups_without_spread": flat,
            "pass_at_1": estimators.pass_at({t: (sum(o is not None for o in os_), sum(o is True for o in os_))
                                             for t, os_ in outcomes.items() if any(o is not None for o in os_)},
                                            1)["1"]}
