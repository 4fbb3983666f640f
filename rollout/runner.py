"""The rollout runner: tasks → K samples of an unmodified agent, each in a sandbox → verified rewards → trainer batches.

One run lives in one directory RUN:

    RUN/run.json          run id, the run's options, the proxy (pid, port), the preflight that passed
    RUN/results.jsonl     one line per attempt, appended as it ends (RESULT_FIELDS); a sample's latest line decides
    RUN/rewards.jsonl     polar-process's rewards, rewritten from results.jsonl just before processing
    RUN/samples/<task>/<k>/<attempt>/{agent.stdout, agent.stderr, final.diff, verifier/, verifier.log, sample.json}
    RUN/predictions.jsonl each sample's git patch in SWE-bench's shape (rollout/patches.py), when a start state is a
                          git repository
    RUN/builds/<task>.log the image build of a task whose environment is a Dockerfile (rollout/images/environments.py)
    RUN/flows/            the flow records of the proxy the runner started (--upstream)
    RUN/out/              polar-process's outputs (one --session-prefix per task: preflight sessions left out)
    RUN/summary.json      the end-of-run summary (statuses, rewards, whether the rewards are isolation-safe)

Identity: session `<run-id>/<task-id>/<k>/<attempt>`, group `<run-id>/<task-id>`. A sample's status follows the table
in rollout/ledger.py (the result row); only the statuses with a reward reach rewards.jsonl (and so the advantages).

This module is the orchestration (`Runner`): prepare RUN, open the proxy, the preflight, the plan, the samples, then
rewards, processing and the summary. Each step lives in a module of its own:

    options.py    the options and their checks           resume.py      --resume and the plan of attempts
    environments.py  each task's image: built or looked up, exported (images.py, runtime.py)
    proxyctl.py   the proxy's lifecycle                  preflight.py   the canary call and canary sample
    job.py        a sample's inputs                      sample.py      one attempt, start to end
    agentcmd.py   the agent's argv, env and mounts       verify.py      the verifier and the reward file rule
    flowwatch.py  calls per session, from the records    treediff.py    final.diff (a tree's text diff)
    patches.py    final.diff as a git patch, predictions.jsonl, what a reward line carries (gitpatch.py: the patch)
    ledger.py     the result row, results/rewards.jsonl  schedule.py    local and Ray scheduling, Ctrl-C
    progress.py   the bar / lines on stderr              processing.py  polar-process
    summary.py    summary.json and the exit code         procs.py       process control
    common.py     identities, UsageError, CANCEL, JSON files
    serve.py      `polar-rollout serve`: this Runner on request, one proxy and preflight for many runs
    serve_protocol.py  its files (requests, responses, ready.json), standard library only
    runflows.py   a served run's RUN/flows: links to the serve's flow files

Samples run on a thread pool (`--engine local`) or as Ray tasks (`--engine ray`); every result line is written by
this process, so results.jsonl has one writer.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from polar.launch import paths
from polar.records.results import latest_by_sample
from polar.rollout import overlay, patches, proxyctl, resume
from polar.rollout import turn_states
from polar.rollout.reporter import Reporter
from polar.rollout.sandbox import control, registry
from polar.rollout.common import CANCEL, PREFLIGHT, VERSION, UsageError, lock_dir, now, read_json, write_json
from polar.rollout.job import AgentSpec, SampleContext, SampleJob
from polar.rollout.ledger import Results, write_rewards
from polar.rollout.options import REUSED, Options, check_options
from polar.rollout.preflight import run_preflight
from polar.rollout.processing import run_processor
from polar.rollout.progress import Progress
from polar.rollout.proxyctl import Proxy
from polar.rollout.sample import DEFAULT_AGENT_TIMEOUT
from polar.rollout.schedule import Plan, execute
from polar.rollout.specs import DEFAULT_VERIFY_TIMEOUT
from polar.rollout.summary import RunShape, summarize

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class Runner:
    def __init__(self, opts: Options, report: Reporter | None = None):
        self.opts = opts
        self.report = report or Reporter()  # every line the run tells its user goes through it
        self.run_dir = Path(os.path.abspath(opts.out))
        self.results = Results(self.run_dir / "results.jsonl")
        self.proxy: Proxy | None = None
        self.run_doc: dict = {}
        self.tasks: list = []
        self.agent: AgentSpec | None = None
        self.box = None  # the sandbox backend (rollout/sandbox/registry.py), once the options are checked
        self._lock_fd: int | None = None
        self.cancelled = False
        self.slots = None  # polar-rollout serve: the sample slots every run it serves shares (schedule.Plan)
        self.envs: dict | None = None  # task id → TaskEnv; None when every task runs in the host view
        self.runtime = None  # the sandbox runtime, when a task runs in an image
        self.overlay = False  # image tasks' working directories are overlays (rollout/overlay.py), else copies
        self.turn_states = None  # turn_states.TurnStates under --turn-states async|hold
        # A new run refused before its first sample leaves --out as it found it (absent, or empty): _claimed once
        # RUN was found absent or empty (not a --resume), _sampling once the first sample may have started.
        self._out_existed = self.run_dir.exists()
        self._claimed = False
        self._sampling = False

    # -- entry ------------------------------------------------------------------------------------------------
    def run(self) -> int:
        refused = False
        try:
            return self._run()
        except UsageError as exc:
            self.report.error(str(exc))
            refused = True
            return 2
        finally:
            proxyctl.stop_proxy(self.proxy)
            turn_states.close_for_run(self.turn_states)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            if refused and self._claimed and not self._sampling:
                self._restore_out()

    def _restore_out(self) -> None:
        """Undo what a refused new run wrote (run.json, .lock, the proxy's files, the preflight's): RUN removed if
        it was absent, emptied if it was empty, so the retry needs no --resume."""
        import shutil

        if not self._out_existed:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return
        for child in list(self.run_dir.iterdir()) if self.run_dir.is_dir() else []:
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)

    def _run(self) -> int:
        self._prepare()
        self._environments()
        self._open_proxy()
        self._preflight()
        jobs, done_before = resume.plan(self.results, self.tasks, self.opts.samples, self.opts.retry_infra,
                                        self.run_dir, self.report)
        progress = self._progress(jobs, done_before)
        if jobs:
            o = self.opts
            self.report.note(f"run {self.run_doc['run_id']}: {len(jobs)} sample(s) to run of {progress.total} "
                             f"({len(self.tasks)} task(s) × {o.samples}), agent {self.agent.text}, sandbox "
                             f"{o.sandbox}, --parallel {o.parallel}, engine {o.engine}")
            plan = Plan(jobs, o.parallel, o.retry_infra, o.engine, o.ray_address, slots=self.slots)
            ctx = self._context()
            self._sampling = True
            self.cancelled = execute(ctx, plan, self.results, progress)
        progress.end()
        proxyctl.stop_proxy(self.proxy)  # its flow files are closed (renamed .msgpack) before processing
        lines = self.results.read()
        write_rewards(self.run_dir / "rewards.jsonl", lines, lambda line: patches.carried(self.run_dir, line))
        self._predictions(lines)
        if self.cancelled:
            self.report.note(f"cancelled; results and records kept in {self.run_dir} (continue with --resume)")
            return summarize(self._shape(), lines, None, True, self.report)
        processed = None if self.opts.no_process else self._process()
        if processed is not None:  # what polar-train reads (exit, seconds, counts); the command stays in process.log
            self.run_doc["processed"] = {k: v for k, v in processed.items() if k != "command"}
            self._save_run_doc()
        return summarize(self._shape(), lines, processed, False, self.report)

    def _progress(self, jobs: list[SampleJob], done_before: int) -> Progress:
        """The progress of the whole run: the samples already done (a resumed run's) counted in."""
        progress = Progress(len(self.tasks) * self.opts.samples, self.opts.progress, self.report.err)
        progress.done = done_before
        to_run = {j.key for j in jobs}
        for line in latest_by_sample(self.results.read()).values():
            if (line["task"], line["k"]) not in to_run:
                progress.count(line["status"], line.get("reward"))
        return progress

    # -- RUN, run.json, tasks -------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        o = self.opts
        self._read_previous()
        o.samples = 4 if o.samples is None else o.samples
        o.sandbox = o.sandbox or "bwrap"
        o.engine = o.engine or "local"
        self.agent = check_options(o)
        self.box = registry.get(o.sandbox)
        self._load_tasks()
        from polar.rollout.agent_check import check_agent

        check_agent(self.agent, [t.agent_dir for t in self.tasks], paths.npm_dir(o.npm_dir))
        why = registry.available(o.sandbox)
        if why:
            raise UsageError(f"--sandbox {o.sandbox}: {why}")
        if o.resume:
            resume.check_identity(o, self.tasks, self.run_doc, self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._claimed = not o.resume
        self._lock()
        removed, killed = control.sweep_stale_controls()
        swept = overlay.sweep(own_run=self.run_dir)
        if swept:
            self.report.note(f"unmounted {len(swept)} sample working director(ies) a run left mounted when it ended "
                             f"without its teardown")
        if removed:
            self.report.note(f"removed {removed} sandbox control dir(s) of dead runs"
                             + (f", killed {killed} process(es) their agents left" if killed else ""))
        if o.resume:
            resume.clean_dead_attempt(self.run_dir, self.run_doc, o.sandbox, self.results, self.report)
        else:
            self.run_doc = {"version": VERSION, "run_id": self._new_run_id(), "created": now()}
        self.run_doc.update(
            tasks=[t.id for t in self.tasks], task_paths={t.id: str(t.path) for t in self.tasks},
            agent=o.agent, samples=o.samples, sandbox=o.sandbox, isolation_safe=self.box.isolated,
            options={k: getattr(o, k) for k in REUSED}, runner_pid=os.getpid(), updated=now())
        self.run_doc.setdefault("preflight", None)
        self._save_run_doc()

    def _read_previous(self) -> None:
        """--resume: run.json read and its options merged in; else RUN must be absent or empty."""
        doc_path = self.run_dir / "run.json"
        if self.opts.resume:
            if not doc_path.is_file():
                raise UsageError(f"--resume: {self.run_dir} has no run.json (nothing to resume); drop --resume to "
                                 f"start a run there")
            try:
                self.run_doc = read_json(doc_path)
            except (OSError, ValueError) as exc:
                raise UsageError(f"--resume: {doc_path} is unreadable ({exc})") from None
            resume.merge_resume(self.opts, self.run_doc)
        elif self.run_dir.exists() and (not self.run_dir.is_dir() or any(self.run_dir.iterdir())):
            raise UsageError(f"--out {self.run_dir} is not empty; pass --resume to continue the run there, or choose "
                             f"another directory")

    def _load_tasks(self) -> None:
        from polar.rollout import tasks as tasklib

        o = self.opts
        try:
            self.tasks = tasklib.load_tasks(o.tasks)
        except tasklib.TaskError as exc:
            raise UsageError(str(exc)) from None
        for t in self.tasks:
            if t.id == PREFLIGHT:
                raise UsageError(f"task {t.id} ({t.path}): the id {PREFLIGHT!r} is reserved for the runner's "
                                 f"preflight sessions; rename the directory")
        if self.agent.kind == "python" and self.box.isolated and sys.prefix == sys.base_prefix:
            raise UsageError("python: agents run with the runner's virtual environment, and this interpreter is not "
                             "in one; run polar-rollout from .venv")

    def _environments(self) -> None:
        """Each task's image, before the proxy opens (rollout/images/environments.py); run.json records them, and a resumed
        run whose images changed is refused."""
        from polar.rollout.images import environments as envlib
        from polar.rollout.images.refs import ImageError, parse_image_map

        o = self.opts
        try:
            image_map = parse_image_map(o.image_map)
        except ImageError as exc:
            raise UsageError(str(exc)) from None
        if not (o.image or any(t.image_task for t in self.tasks)):
            return
        harbor_open = [t.id for t in self.tasks if t.image_task and t.allow_internet is not False]
        if harbor_open:
            self.report.note(f"{len(harbor_open)} task(s) allow the internet under Harbor (allow_internet, whose "
                             f"default is true); here a sandbox reaches the proxy and nothing else")
        self.envs = envlib.prepare(self.tasks, envlib.PhaseOptions(
            image=o.image, image_map=image_map, build_network=o.build_network, sandbox=o.sandbox,
            builds_dir=self.run_dir / "builds", pull=o.pull), log=self.report.note)
        for env in self.envs.values():
            if env.substitutions and not env.error:
                self.report.note(f"task {env.task}: runs on a substituted base "
                                 f"({', '.join(f'{a} → {b}' for a, b in env.substitutions)})")
        previous = self.run_doc.get("environments") if o.resume else None
        if previous:
            changed = [f"{tid} ({doc.get('image_id')} → {self.envs[tid].image_id})" for tid, doc in previous.items()
                       if tid in self.envs and doc.get("image_id") != self.envs[tid].image_id]
            if changed:
                raise UsageError(f"--resume: the image of {len(changed)} task(s) changed since the run started: "
                                 f"{'; '.join(changed)}; its samples would mix environments — start a new run in "
                                 f"another --out")
        if any(env.image_mode and not env.error for env in self.envs.values()):
            self.runtime = self._build_runtime()
            self.overlay = self._overlay_views()
        self.run_doc["environments"] = {tid: env.describe() for tid, env in self.envs.items()}
        self.run_doc["image_map"] = [f"{e.ref.canonical()}={e.local}" for e in image_map.entries]
        self.run_doc["runtime"] = {"root": str(self.runtime.root), "key": self.runtime.key} if self.runtime else None
        self._save_run_doc()

    def _overlay_views(self) -> bool:
        """Whether image tasks' working directories can be overlays here; the copies they are otherwise, said once."""
        why = overlay.why_no_overlay(str(self.run_dir / ".work"))
        if why:
            self.report.note(f"the image tasks' working directories are copies of the image's WORKDIR, not overlays "
                             f"({why}): a large WORKDIR costs seconds a sample"
                             + ("; the image's root stays read-only for the agent"
                                if self.box.exports_rootfs else ""))
        return why is None

    def _build_runtime(self):
        import shutil

        from polar.rollout.images import runtime as rtlib

        python = Path(os.path.realpath(Path(sys.prefix) / "bin" / "python"))
        node = shutil.which("node") if self.agent.kind == "cli" else None
        try:
            return rtlib.build_runtime(paths.images_dir() / "runtime", python=python,
                                       node=Path(node) if node else None)
        except rtlib.RuntimeBuildError as exc:
            raise UsageError(f"the sandbox runtime (for the tasks that run in an image): {exc}") from None

    def _new_run_id(self) -> str:
        from polar.records import uuid7

        run_id = self.opts.run_id or uuid7()
        if not RUN_ID.fullmatch(run_id):
            raise UsageError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-' (it starts every "
                             f"session id)")
        return run_id

    def _lock(self) -> None:
        self._lock_fd = lock_dir(self.run_dir, f"another polar-rollout runs on {self.run_dir} (its lock is held)")

    def _save_run_doc(self) -> None:
        write_json(self.run_dir / "run.json", self.run_doc)

    # -- the proxy, the samples' context ---------------------------------------------------------------------------
    def _open_proxy(self) -> None:
        sets = []
        if self.opts.turn_states not in (None, "off"):  # the proxy is told where to announce calls
            self.turn_states, sets = turn_states.open_for_run(self.run_dir, self.opts.turn_states)
        self.proxy, proxy_json = proxyctl.attach(self.opts, self.run_dir, self.report, sets)
        if self.turn_states is not None and not self.proxy.own:
            raise UsageError(f"--turn-states {self.opts.turn_states} needs the proxy the runner starts (pass --upstream "
                             f"URL), which it tells where to announce calls; {proxy_json} is a running one")
        proxyctl.check_ready(self.proxy, self.box.isolated, proxy_json)
        self.run_doc["proxy"] = proxyctl.describe(self.proxy)
        self._save_run_doc()

    def _context(self) -> SampleContext:
        o, p = self.opts, self.proxy
        assert p is not None and self.agent is not None
        npm = paths.npm_dir(o.npm_dir)
        if npm is None and self.agent.kind != "python" and self.box.isolated:  # the sandbox mounts it
            raise UsageError(f"--agent {o.agent}: {paths.missing('npm_dir')}")
        return SampleContext(
            run_id=self.run_doc["run_id"], run_dir=str(self.run_dir), agent=self.agent, sandbox=o.sandbox,
            image="polar-sandbox:1", model=o.model, proxy_port=p.port, ca_pem=p.ca_pem,
            ca_bundle=p.ca_bundle, flows=p.flows, venv=sys.prefix, npm_dir=str(npm or ""),
            agent_timeout=o.agent_timeout, verify_timeout=o.verify_timeout, warm=o.warm_agents,
            turn_states=o.turn_states or "off", parallel=max(1, o.parallel),
            connect=o.connect, envs=self.envs, runtime=self.runtime, reward_key=o.reward_key, overlay=self.overlay)

    # -- preflight ------------------------------------------------------------------------------------------------
    def _preflight(self) -> None:
        prev = self.run_doc.get("preflight")
        if self.opts.skip_preflight:
            if not (isinstance(prev, dict) and prev.get("passed")):
                self.report.warn("--skip-preflight: no preflight has passed in this RUN; the backend's token ids and "
                                 "the sandbox are not checked")
            return
        assert self.proxy is not None
        self.run_doc["preflight"] = run_preflight(self.proxy, self._context(), self.tasks[0], self.run_dir,
                                                 self.report)
        self._save_run_doc()

    # -- after the samples ------------------------------------------------------------------------------------------
    def _predictions(self, lines: list[dict]) -> None:
        """RUN/predictions.jsonl: each git patch in SWE-bench's shape (rollout/patches.py)."""
        run_id = self.run_doc["run_id"]
        model = (patches.served_model(self.proxy.flows, run_id) if self.proxy is not None else None) \
            or self.opts.model or "unknown"
        records = {t.id: patches.task_record(t.path) for t in self.tasks}
        if patches.write_predictions(self.run_dir, lines, records, model):
            self.report.note(f"predictions (SWE-bench's shape, model {model}): {self.run_dir / 'predictions.jsonl'}")

    def _process(self) -> dict:
        o, p = self.opts, self.proxy
        assert p is not None
        return run_processor(self.run_dir, p.flows, self.run_doc["run_id"], [t.id for t in self.tasks],
                             o.sft_min_reward, o.process_opt, self.report, upstream=p.info.get("upstream"))

    def _shape(self) -> RunShape:
        o = self.opts
        return RunShape(run_dir=self.run_dir, run_id=self.run_doc["run_id"], task_ids=[t.id for t in self.tasks],
                        samples=o.samples, agent=self.agent.text, sandbox=o.sandbox, no_process=o.no_process,
                        time_limits={t.id: time_limits(o, t) for t in self.tasks})


def time_limits(o: Options, task) -> dict:
    """A task's time limits as its samples get them (--agent-timeout / --verify-timeout, else task.toml, else 600 s)."""
    return {"agent_s": o.agent_timeout or task.agent_timeout_sec or DEFAULT_AGENT_TIMEOUT,
            "verifier_s": o.verify_timeout or task.verifier_timeout_sec or DEFAULT_VERIFY_TIMEOUT}


def main(opts: Options, report: Reporter | None = None) -> int:
    CANCEL.clear()
    return Runner(opts, report).run()
