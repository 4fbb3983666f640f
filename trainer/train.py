"""polar-train TASKS... --agent AGENT --model DIR --out RUN (docs/architecture.md#the-trainer-side): the closed loop,
one step at a time.

Each step N (RUN/steps/000N/ is a polar-rollout RUN):
1. rollout — `polar-rollout` (the proxy's environment, `--rollout-cmd`) runs K samples of the unmodified agent per
   task behind a proxy of its own, in exact mode, with sampling pinned (`polar_sampling_override=temperature=1.0,
   top_p=1.0,top_k=-1` unless `--sampling` says otherwise), against the vLLM that serves the current weights; it
   verifies them, writes rewards and groups, and processes the records (RUN/steps/000N/out).
2. verify — polar-verify's check, in this process, on the model in memory (the weights that served the step): the
   sampler's logprobs against a recompute, one no-grad pass; verify.parquet and report.json's `verify` as
   polar-verify writes them (reported; a bound exceeded is a warning, not a failed stage).
3. train — `--mini-batches M` × `--epochs E` GRPO updates (`polar.trainer.grpo.grpo_update`: token-sum
   normalisation over each mini-batch, π_old = the recorded logprobs, so from the second update on the clip
   matters) over the step's micro-batches; the optimizer state carries over from step to step. A step where no
   group has a reward spread (`groups_without_spread` = groups: every advantage 0) makes no update, no checkpoint
   and no publication — the same version keeps serving, the step's line says so — and the loop goes on; so does a
   step at `--lr 0` (a control: the weights cannot change, so there is nothing to publish).
4. checkpoint — a complete HF directory, RUN/checkpoints/step-000N/ (`--keep-checkpoints N`: the newest N stay),
   with the trainer's state beside the weights (polar.trainer.state: optimizer, RNGs, cursor, the step's line).
5. reload — `polar.launch.publish` (what `polar-vllm reload --weights RUN/checkpoints/step-000N --version
   step-000N` does): the next rollouts are served by the new weights (their records carry weight_version
   step-000N). Before step 1 the server is reloaded with `--model` as step-0000, so every record of the run names
   the weights that sampled it.
One line per step in RUN/train.jsonl (TRAIN_FIELDS); RUN/report.html draws the loop's curves. Besides the reward
mean, a line holds its spread (`reward_std`), `groups_without_spread`, `updates`, `response_len` (trainable tokens
per sequence), `entropy` (the policy's mean token entropy on them) and `kl_initial` (k3 KL to the initial policy,
from a frozen copy of --model: one no-grad forward per micro-batch), both measured before the step's first update,
and `eval_reward`: `--eval-tasks` (held-out tasks, never trained on) rolled out at the same time as steps 1,
1+N, … (`--eval-every N`) and the last, with no update (null on the other steps).

TASKS may be task directories or folders of them (a generated family: examples/tasks/families); `--tasks-per-step
N` draws N of them per step, seeded by (`--seed`, step), so `--resume` draws the same. `--seed` also seeds torch
and the mini-batch shuffle. It does not seed the sampler: the proxy's `seed` override is one value for every
request, which would make the K samples of a prompt identical (no spread), and per-sample seeds are not supported.
Without `--lr` the learning rate (and the updates per batch) is picked from the model's parameter count
(`default_lr`), printed first and recorded in RUN/train.json (`lr_source`).

The vLLM: `--vllm-run-file F` names a running dev-mode server (`polar-vllm start --dev`) that serves `--model`, or
a pool of them (`--replicas N`: the rollout's proxy gets every replica's base URL, and each step publishes to every
replica with the proxies held once); without it polar-train starts one (`--dtype`, dev mode; `polar.launch.vllm`)
with its run file RUN/vllm.json and stops it at the end. polar-rollout is `--rollout-cmd`, else $POLAR_ROLLOUT, else
polar-rollout on PATH, else the checkout's .venv/bin/polar-rollout.
`--resume` continues a RUN: the steps in train.jsonl stay, the model, the optimizer and the RNGs go to the last
checkpoint's, the server serves it, and an unfinished step's rollout continues (`polar-rollout --resume`: finished
samples are kept). A step killed after its checkpoint was written (before its line, or during publication) is
published and its line appended — never trained twice. Layout: plan.py (the command line, the Plan, the defaults),
rollout_stage.py (the rollout stage), state.py (what a checkpoint holds for --resume), this module (the step, the
loop).
Exit 0 every step ran; 1 a stage failed (one line names the step and the stage); 2 bad input (one line names the fix).
torch is imported after the arguments are checked.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from polar.launch import paths
from polar.launch import publish as publishing
from polar.launch import vllm as launch_vllm
from polar.launch.runfiles import VllmPoolRunFile, VllmRunFile
from polar.processor.report_doc import read_report
from polar.trainer import has_trainer_env, needs_trainer_env
from polar.trainer.plan import BadInput, Plan, StageFailed, check_args, parser, task_dirs, tasks_of_step
from polar.trainer.rollout_stage import RolloutService, rewards_of, step_dir, version_index, version_of

NEEDS_TRAIN = needs_trainer_env("polar-train")
TRAIN_FIELDS = ("step", "weight_version", "samples", "statuses", "reward_mean", "reward_mean_per_group",
                "verify_median_abs_gap", "verify_share_within", "ratio_mean", "ratio_max", "clip_share", "tis_share",
                "loss", "tokens_forward", "tokens_trainable", "seconds", "reward_std", "groups",
                "groups_without_spread", "updates", "response_len", "entropy", "kl_initial", "eval_reward", "tasks", "published",
                "staleness", "left_out_stale", "clip_share_by_staleness", "rollout_wait", "clip_share_low",
                "clip_share_high", "entropy_coef")
STAGES = ("rollout", "process", "verify", "train", "reload")


# ---------------------------------------------------------------------------------------------------- vLLM

def _say(msg: str) -> None:
    print(f"polar-train: vllm: {msg}", file=sys.stderr, flush=True)


def crash_point(name: str, step: int) -> None:
    """The seam of the resume tests: `POLAR_TRAIN_KILL_AT=NAME:STEP` SIGKILLs this process here, as a power cut
    would (no handler runs). NAME: `checkpoint-write` (inside the checkpoint's write: its temporary directory whole,
    not renamed), `checkpoint` (saved, not published), `pool-reload` (during publication, once the first backend —
    the first replica of a pool — serves the new version, the proxies held), `publication` (published, no line
    yet)."""
    if os.environ.get("POLAR_TRAIN_KILL_AT") == f"{name}:{step}":
        os.kill(os.getpid(), 9)


def _say_step(msg: str) -> None:  # every line of polar-train goes to stderr, as it happens
    print(msg if msg.startswith("polar-train: ") else f"polar-train: {msg}", file=sys.stderr, flush=True)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or ["no message"])[0]


def server_info(run_file: str) -> VllmRunFile | VllmPoolRunFile:
    """The run file of the server, or of the pool of replicas (`polar-vllm start --replicas N`)."""
    info = launch_vllm.read_any(run_file)
    if info is None:
        raise StageFailed(0, "vllm", f"{run_file}: no vLLM run file")
    return info


def start_server(plan: Plan, run: Path) -> tuple[str, bool]:
    """(run file, started by us): the server (or pool) named by --vllm-run-file, or a new dev-mode one."""
    if plan.vllm_run_file:
        info = launch_vllm.read_any(plan.vllm_run_file)
        if isinstance(info, VllmPoolRunFile):  # every replica reloads: each must be in dev mode
            replicas = launch_vllm.replica_infos(info)
            info = None if any(r is None or not r.dev for r in replicas) else info
        if info is None or not info.dev:
            raise BadInput(f"--vllm-run-file {plan.vllm_run_file}: that server is not in dev mode "
                           f"({launch_vllm.command()} start --dev): it cannot reload weights")
        return plan.vllm_run_file, False
    run_file = paths.vllm_run_file(run)
    if run_file.is_file():  # --resume: the server a previous attempt started, if it still runs
        if launch_vllm.status(run_file) is not None:
            return str(run_file), True
        run_file.unlink()
    spec = launch_vllm.StartSpec(model=plan.model, dtype=plan.dtype, dev=True, run_file=run_file)
    try:
        launch_vllm.start(spec, log=_say)
    except launch_vllm.Fail as exc:
        raise StageFailed(0, "vllm start", _first_line(exc)) from None
    return str(run_file), True


def base_url(run_file: str) -> str:
    """The server's base URL; a pool's replicas as one comma-separated list (what the gateway's upstream takes)."""
    return server_info(run_file).base_url


def reload(step: int, run_file: str, weights: Path, version: str, proxies: list[str] | None = None) -> float:
    """Publish `weights` as `version`, holding `proxies` (the rollout stage's) meanwhile; the seconds it took."""
    t0 = time.monotonic()
    try:
        done = publishing.publish([run_file], weights, version, proxies=proxies or [], log=_say,
                                  after_each=lambda backend: crash_point("pool-reload", step))
    except launch_vllm.Fail as exc:
        raise StageFailed(step, "reload", _first_line(exc)) from None
    if done.problems:
        raise StageFailed(step, "reload", done.problems[0])
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------------- one step

def verify(step: int, out: Path, trainer: "Trainer", serving: str, weights: str) -> tuple[dict, float]:
    """polar-verify's check of the step's samples, in this process, on the model in memory (it holds exactly the
    weights that served them: publication follows each update): its columns, verify.parquet and report.json's
    `verify`, with no second load of the model. Only calls of the serving version are checked; samples of an older
    one (none while rollouts do not overlap training) are counted as skipped (`skipped_no_model`) and left to a
    standalone `polar-verify OUT --model VERSION=DIR`."""
    from polar.trainer import verify as verifier

    t0 = time.monotonic()
    args = verifier.parser().parse_args([str(out), "--model", f"{serving}={weights}", "--dtype", trainer.plan.dtype,
                                         "--max-median", "0"])
    try:
        verifier.run(args, loaded={weights: trainer.model}, say=lambda line: print(line, file=sys.stderr, flush=True),
                     nothing_ok=trainer.plan.max_staleness > 0)
    except verifier.BadInput as exc:
        raise StageFailed(step, "verify", f"polar-verify {out}: {exc}") from None
    return read_report(out / "report.json").verify or {}, time.monotonic() - t0


def load_batches(step: int, trainer: "Trainer", out: Path, required: bool = True):
    """The step's micro-batches; rows staler than --max-staleness behind the policy in memory are left out."""
    from polar.trainer.loader import Staleness, micro_batches

    rule = Staleness(current=version_index(trainer.version) or 0, index=version_index,
                     limit=trainer.plan.max_staleness)
    # a context_mismatch sequence's recorded logprobs were sampled under another context than the one it holds:
    # they are no π_old for it (slime drops such samples too: remove_sample)
    batches = micro_batches(str(out / "batches"), trainer.plan.micro_batch_tokens, layout="per_sequence",
                            leave_out_flags=("context_mismatch",), staleness=rule)
    if required and not batches.counts.get("tokens_trainable") and not batches.counts.get("left_out_stale"):
        raise StageFailed(step, "train", f"no trainable token in {out}/batches ({batches.counts})")
    return batches


def has_advantage(batches) -> bool:
    """Whether any trainable token carries a non-zero advantage (else every gradient is 0)."""
    return any(abs(s.advantage) > 0 and float(s.loss_mask[1:].sum()) > 0 for g in batches.groups for s in g)


def train_step(step: int, trainer: "Trainer", out: Path, batches=None, update: bool = True) -> dict:
    """M·E GRPO updates over the step's batches (grpo.grpo_update); with `update` False only the measurement
    (entropy, KL to the initial policy, response length), no optimizer step."""
    from polar.trainer import grpo

    plan = trainer.plan
    batches = batches if batches is not None else load_batches(step, trainer, out)
    if not update:
        m = grpo.StepMetrics(tokens_forward=batches.counts["tokens_forward"],
                             tokens_trainable=batches.counts["tokens_trainable"], micro_batches=len(batches))
        n = sum(len(g) for g in batches.groups)
        m.sequences, m.response_len = n, (m.tokens_trainable / n if n else None)
        m.entropy_coef = trainer.entropy.coef if trainer.entropy.enabled else None
        if m.tokens_trainable:
            m.entropy, m.kl_initial = grpo._measure(trainer.model, batches, trainer.reference)
        return m.as_dict()
    metrics = grpo.grpo_update(trainer.model, trainer.optimizer, batches, trainer.config,
                               mini_batches=plan.mini_batches, epochs=plan.epochs, seed=plan.seed * 1_000_003 + step,
                               reference=trainer.reference, entropy=trainer.entropy)
    return metrics.as_dict()


@dataclass
class Trainer:
    """The policy in memory, its optimizer (carried over from step to step) and the GRPO settings."""

    plan: Plan
    model: object
    optimizer: object
    config: object
    reference: object = None  # the initial policy, frozen (--kl-initial)
    entropy: object = None  # grpo.EntropyControl: the entropy bonus's coefficient, carried from step to step
    weights: str = ""  # the directory the model in memory was saved to (or loaded from)
    version: str = ""  # its version: what the server serves

    @classmethod
    def load(cls, plan: Plan, weights: str) -> "Trainer":
        import random

        import torch
        from polar.trainer import grpo
        from polar.trainer.recompute import load_model

        random.seed(plan.seed)
        torch.manual_seed(plan.seed)
        config = grpo.GrpoConfig(lr=plan.lr, clip=plan.clip, tis_cap=plan.tis_cap, weight_decay=plan.weight_decay,
                                 clip_high=plan.clip_high, entropy_coef=plan.entropy_coef,
                                 entropy_target=plan.entropy_target, normalize=plan.normalize)
        model = load_model(weights, plan.dtype)
        model.requires_grad_(True)
        reference = None
        if plan.kl_initial:
            reference = load_model(plan.model, plan.dtype)
            reference.requires_grad_(False)
        return cls(plan=plan, model=model, optimizer=grpo.make_optimizer(model, config), config=config,
                   reference=reference, weights=str(weights), entropy=grpo.EntropyControl.of(config))


def evaluates(plan: Plan, step: int) -> bool:
    """Whether the held-out tasks are rolled out at this step (before its update): steps 1, 1+N, 1+2N, … and the
    last."""
    return bool(plan.eval_tasks) and ((step - 1) % plan.eval_every == 0 or step == plan.steps)


def run_step(step: int, trainer: Trainer, run: Path, run_file: str, rolled: tuple, stage: RolloutService) -> dict:
    """Verify → train → checkpoint → reload, once the step's rollout (`rolled`: RolloutService.finish and the
    seconds the trainer waited for it) is in; the step's train.jsonl line. A step where no group has a reward spread
    (every advantage 0) makes no update; one whose update cannot change the weights (--lr 0) keeps them: either way
    no checkpoint and no publication — the same version keeps serving."""
    plan = trainer.plan
    (doc, t_rollout, evaluation), waited = rolled
    serving, weights = trainer.version, trainer.weights
    out = step_dir(run, step) / "out"
    t_process = float((doc.get("processed") or {}).get("seconds") or 0.0)
    r = rewards_of(step_dir(run, step))
    summary, t_verify = verify(step, out, trainer, serving, weights)
    t0 = time.monotonic()
    spread = r["groups"] > r["groups_without_spread"]
    batches = load_batches(step, trainer, out, required=spread)
    signal = spread and has_advantage(batches)
    m = train_step(step, trainer, out, batches, update=signal)
    publish = signal and plan.lr > 0
    why = None if publish else ("no reward spread: no update" if not signal else "--lr 0: weights unchanged")
    line = step_line(step, plan, serving, r, m, summary, evaluation, why)
    line.update(staleness=staleness_stats(batches.stalenesses), left_out_stale=batches.counts.get("left_out_stale", 0),
                clip_share_by_staleness=m.get("clip_share_by_staleness") or {})
    line["seconds"] = {"rollout": round(t_rollout - t_process, 2), "process": round(t_process, 2),
                       "verify": round(t_verify, 2), "train": 0.0, "checkpoint": 0.0, "reload": 0.0}
    line["rollout_wait"] = round(waited, 2)  # of `rollout`, what the trainer waited for (less when it overlaps)
    line["checkpoint"] = weights
    if publish:
        line["checkpoint"] = str(run / "checkpoints" / version_of(step))
        line["seconds"]["train"] = round(time.monotonic() - t0, 2)
        line["seconds"]["checkpoint"] = None  # as the checkpoint holds the line: a resumed step has it unmeasured
        t0 = time.monotonic()
        save(trainer, line)
        line["seconds"]["checkpoint"] = round(time.monotonic() - t0, 2)
        crash_point("checkpoint", step)
        return finish(line, trainer.plan, run, run_file, stage.proxies())
    line["seconds"]["train"] = round(time.monotonic() - t0, 2)
    return line


def staleness_stats(values: list[int]) -> dict:
    """train.jsonl's `staleness`: min, mean and max over the step's rows whose staleness is known."""
    if not values:
        return {"min": None, "mean": None, "max": None}
    return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)}


def step_line(step: int, plan: Plan, serving: str, r: dict, m: dict, summary: dict, evaluation: dict | None,
              why: str | None) -> dict:
    """The step's train.jsonl line (TRAIN_FIELDS and the rest), before its checkpoint and publication."""
    return {"step": step, "weight_version": serving, "samples": r["samples"], "statuses": r["statuses"],
            "reward_mean": r["reward_mean"], "reward_mean_per_group": r["reward_mean_per_group"],
            "reward_std": r["reward_std"], "groups": r["groups"], "groups_without_spread": r["groups_without_spread"],
            "updates": m.get("updates") or 0, "response_len": m.get("response_len"), "entropy": m.get("entropy"),
            "kl_initial": m.get("kl_initial"),
            "eval_reward": evaluation["reward_mean"] if evaluation else None,
            "eval_samples": evaluation["samples"] if evaluation else None,
            "eval_pass_at_1": evaluation["pass_at_1"] if evaluation else None,
            "tasks": [Path(t).name for t in tasks_of_step(plan, step)],
            "published": why is None, "serving_after": version_of(step) if why is None else serving,
            "no_publication": why,
            "verify_median_abs_gap": summary.get("median_abs_gap"),
            "verify_share_within": summary.get("share_within"), "ratio_mean": m.get("ratio_mean"),
            "ratio_max": m.get("ratio_max"), "clip_share": m.get("clip_share"), "tis_share": m.get("tis_share"),
            "clip_share_low": m.get("clip_share_low"), "clip_share_high": m.get("clip_share_high"),
            "entropy_coef": m.get("entropy_coef"),
            "loss": m.get("loss"), "tokens_forward": m.get("tokens_forward"),
            "tokens_trainable": m.get("tokens_trainable"), "first_ratio_max_dev": m.get("first_ratio_max_dev"),
            "grad_norm": m.get("grad_norm"), "left_out": m.get("left_out")}


def save(trainer: Trainer, line: dict) -> None:
    """The checkpoint of the step's update, with the trainer's state and the step's line (polar.trainer.state)."""
    from polar.trainer.checkpoint import save_checkpoint
    from polar.trainer.state import write_state

    step = line["step"]
    def extra(tmp: str) -> None:
        write_state(tmp, optimizer=trainer.optimizer, step=step, cursor=step + 1, line=line,
                    entropy=trainer.entropy)
        crash_point("checkpoint-write", step)  # the directory whole under its temporary name, not renamed yet

    save_checkpoint(trainer.model, line["checkpoint"], trainer.plan.model, extra=extra)


def finish(line: dict, plan: Plan, run: Path, run_file: str, proxies: list[str]) -> dict:
    """Publish a saved step's checkpoint and prune the old ones; the line with its reload time. --resume calls it
    too, for a step killed after its checkpoint (publishing the same weights twice is harmless)."""
    ckpt = Path(line["checkpoint"])
    line = {**line, "seconds": {**line["seconds"], "reload": 0.0}}
    line["seconds"]["reload"] = round(reload(line["step"], run_file, ckpt, version_of(line["step"]), proxies), 2)
    crash_point("publication", line["step"])
    if plan.keep_checkpoints:
        prune_checkpoints(run, plan.keep_checkpoints, keep=ckpt)
    return line


def prune_checkpoints(run: Path, n: int, keep: Path) -> list[str]:
    """Delete all but the newest `n` checkpoints of the run (never `keep`, the one serving); their names."""
    ckpts = sorted(p for p in (run / "checkpoints").glob("step-*") if p.is_dir())
    gone = []
    for p in ckpts[:-n] if n < len(ckpts) else []:
        if p.resolve() != keep.resolve():
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p.name)
    return gone


# ---------------------------------------------------------------------------------------------------- the run

def read_lines(run: Path) -> list[dict]:
    path = run / "train.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_line(run: Path, line: dict) -> None:
    with open(run / "train.jsonl", "a", encoding="utf-8") as fh:  # one line per finished step: a crash loses one
        fh.write(json.dumps(line, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def prepare(args) -> tuple[Plan, Path]:
    run = Path(args.out).resolve()
    if args.resume:
        raw = json.loads((run / "train.json").read_text())
        plan = Plan(**raw)
        if args.steps != parser().get_default("steps"):  # --resume --steps N: train further
            plan.steps = args.steps
    else:
        plan = Plan.from_args(args)
        (run / "steps").mkdir(parents=True, exist_ok=True)
        (run / "checkpoints").mkdir(exist_ok=True)
    (run / "train.json").write_text(json.dumps(plan.__dict__, indent=1) + "\n")
    return plan, run


def loop(plan: Plan, run: Path) -> int:
    """The steps, from the first not in train.jsonl to --steps. Step N's rollout is asked for when step N−1 has
    published (--max-staleness 0), or as soon as step N−1's own rollout is in (≥ 1: it runs while N−1 trains)."""
    from polar.trainer.report import write_report

    lines = read_lines(run)
    done = max((ln["step"] for ln in lines), default=0)
    weights = plan.model if done == 0 else lines[-1].get("checkpoint") or str(run / "checkpoints" / version_of(done))
    version = version_of(done) if done == 0 else lines[-1].get("serving_after") or version_of(done)
    _say_step(f"lr {plan.lr:g} ({plan.lr_source}), {plan.mini_batches} mini-batch(es) × {plan.epochs} epoch(s) per "
              f"step, seed {plan.seed}, {len(task_dirs(plan.tasks))} task(s)"
              + (f", {plan.tasks_per_step} per step" if plan.tasks_per_step else "")
              + (f", rollouts up to {plan.max_staleness} version(s) ahead" if plan.max_staleness else ""))
    run_file, ours = start_server(plan, run)
    stage = RolloutService(plan, run, base_url(run_file))
    try:
        # the server serves exactly the weights the trainer starts from, under a version of this run (step-0000:
        # --model; on --resume the last checkpoint), whatever it served before; the serve's proxy starts after it
        reload(done, run_file, Path(weights), version)
        trainer = Trainer.load(plan, weights)
        trainer.version = version
        _say_step(f"starting the rollout stage (polar-rollout serve {stage.dir}: one proxy, one preflight)")
        stage.start()
        done = resume_pending(trainer, run, run_file, done, stage)
        ahead = None
        for step in range(done + 1, plan.steps + 1):
            started = ahead or stage.submit(step, evaluates(plan, step))
            _say_step(f"step {step}/{plan.steps}: rollout of {len(tasks_of_step(plan, step))} task(s) × "
                      f"{plan.samples}, policy {trainer.version}"
                      + (", with the held-out evaluation" if started.eval_name else ""))
            t0 = time.monotonic()
            rolled = (stage.finish(started), time.monotonic() - t0)
            ahead = stage.submit(step + 1, evaluates(plan, step + 1)) \
                if plan.max_staleness and step < plan.steps else None
            line = run_step(step, trainer, run, run_file, rolled, stage)
            append_line(run, line)
            trainer.weights, trainer.version = line["checkpoint"], line["serving_after"]
            write_report(run, read_lines(run))
            _say_step(step_summary(line))
    finally:
        stage.stop()
        if ours:
            launch_vllm.stop(run_file, log=_say)
    write_report(run, read_lines(run))
    return 0


def resume_pending(trainer: Trainer, run: Path, run_file: str, done: int, stage: RolloutService) -> int:
    """--resume: the optimizer and RNGs of the last checkpoint; a step trained and saved but killed before its line
    (during publication or just before) is published and its line appended, not trained again. The last step done."""
    from polar.trainer import grpo
    from polar.trainer.recompute import load_model
    from polar.trainer.state import read_state, restore

    ckpt = run / "checkpoints" / version_of(done + 1)
    state = read_state(ckpt) if ckpt.is_dir() else None
    if state is not None:
        trainer.model = load_model(str(ckpt), trainer.plan.dtype)
        trainer.model.requires_grad_(True)
        trainer.optimizer = grpo.make_optimizer(trainer.model, trainer.config)
        restore(state, trainer.optimizer, trainer.entropy)
        _say_step(f"step {done + 1}: trained and saved before the stop; publishing {ckpt.name}")
        line = finish(state["line"], trainer.plan, run, run_file, stage.proxies())
        append_line(run, line)
        trainer.weights, trainer.version = line["checkpoint"], line["serving_after"]
        return done + 1
    last = read_state(Path(trainer.weights)) if done else None
    if last is not None:
        restore(last, trainer.optimizer, trainer.entropy)
    return done


def step_summary(ln: dict) -> str:
    fmt = lambda x, f=".3f": "n/a" if x is None else format(x, f)  # noqa: E731
    s = ln["seconds"]
    return (f"polar-train: step {ln['step']} (weights {ln['weight_version']}): {ln['samples']} samples "
            f"{ln['statuses']}, reward mean {fmt(ln['reward_mean'])}; verify median |gap| "
            f"{fmt(ln['verify_median_abs_gap'], '.2g')}, within {fmt(ln['verify_share_within'])}; ratio mean "
            f"{fmt(ln['ratio_mean'], '.4f')} max {fmt(ln['ratio_max'], '.4f')}, clip {fmt(ln['clip_share'])}, loss "
            f"{fmt(ln['loss'], '.4g')}; {ln['tokens_trainable']} trainable of {ln['tokens_forward']} tokens; "
            f"{' '.join(f'{k} {v:.1f}s' for k, v in s.items() if v is not None)}"
            f"; spread {fmt(ln.get('reward_std'))}, {ln.get('groups_without_spread')} of {ln.get('groups')} group(s) "
            f"without spread, {ln.get('updates')} update(s), entropy {fmt(ln.get('entropy'))}, KL to initial "
            f"{fmt(ln.get('kl_initial'), '.3g')}"
            + (f", eval reward {fmt(ln['eval_reward'])}, pass@1 {fmt(ln.get('eval_pass_at_1'))}"
               if ln.get("eval_reward") is not None else "")
            + (f"; staleness max {ln['staleness']['max']}, {ln.get('left_out_stale')} left out as stale"
               if (ln.get("staleness") or {}).get("max") else "")
            + (f"; {ln['no_publication']}, {ln['serving_after']} keeps serving" if ln.get("no_publication") else ""))


class Stopped(BaseException):
    """SIGTERM or SIGINT: raised where the loop is, so its `finally` ends the serve and the vLLM it started."""


def _on_stop_signal(signum, frame) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_stop_signal)
    try:
        check_args(args)
        if not has_trainer_env():
            print(NEEDS_TRAIN, file=sys.stderr)
            return 2
        plan, run = prepare(args)
        code = loop(plan, run)
    except BadInput as exc:
        print(f"polar-train: {exc}", file=sys.stderr)
        return 2
    except StageFailed as exc:
        print(f"polar-train: {exc}", file=sys.stderr)
        return 1
    except Stopped as exc:
        print(f"polar-train: {exc} received: stopped, its services ended; `polar-train --out {args.out} --resume` "
              f"goes on from the last step saved", file=sys.stderr)
        return 128 + signal.Signals[str(exc)].value
    print(f"polar-train: {plan.steps} step(s) done: {run}/train.jsonl, {run}/report.html", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
