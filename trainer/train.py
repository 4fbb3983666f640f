"""polar-train TASKS... --agent AGENT --model DIR --out RUN (docs/architecture.md#the-trainer-side): the closed loop,
one step at a time.

Each step N (RUN/steps/000N/ is a polar-rollout RUN):
1. rollout — `polar-rollout` (the proxy's environment, `--rollout-cmd`) runs K samples of the unmodified agent per
   task behind a proxy of its own, in exact mode, with sampling pinned (`polar_sampling_override=temperature=1.0,
   top_p=1.0,top_k=-1` unless `--sampling` says otherwise), against the vLLM that serves the current weights; it
   verifies them, writes rewards and groups, and processes the records (RUN/steps/000N/out).
2. verify — `polar-verify` on that output with the checkpoint that served it: the sampler's logprobs against a
   transformers recompute (reported; a bound exceeded is a warning, not a failed stage).
3. train — `--mini-batches M` × `--epochs E` GRPO updates (`polar.trainer.grpo.grpo_update`: token-sum
   normalisation over each mini-batch, π_old = the recorded logprobs, so from the second update on the clip
   matters) over the step's micro-batches; the optimizer state carries over from step to step. A step where no
   group has a reward spread (`groups_without_spread` = groups: every advantage 0) makes no update, no checkpoint
   and no publication — the same version keeps serving, the step's line says so — and the loop goes on; so does a
   step at `--lr 0` (a control: the weights cannot change, so there is nothing to publish).
4. checkpoint — a complete HF directory, RUN/checkpoints/step-000N/ (`--keep-checkpoints N`: the newest N stay).
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

The vLLM: `--vllm-run-file F` names a running dev-mode server (`polar-vllm start --dev`) that serves `--model`;
without it polar-train starts one (`--dtype`, dev mode; `polar.launch.vllm`) with its run file RUN/vllm.json and
stops it at the end. polar-rollout is `--rollout-cmd`, else $POLAR_ROLLOUT, else polar-rollout on PATH, else the
checkout's .venv/bin/polar-rollout.
`--resume` continues a RUN: the steps in train.jsonl stay, the model and the server go to the last checkpoint, and an
unfinished step's rollout continues (`polar-rollout --resume`).
Exit 0 every step ran; 1 a stage failed (one line names the step and the stage); 2 bad input (one line names the fix).
torch is imported after the arguments are checked.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from polar.launch import paths
from polar.launch import publish as publishing
from polar.launch import vllm as launch_vllm
from polar.launch.runfiles import VllmRunFile
from polar.trainer import has_trainer_env, needs_trainer_env

ROLLOUT_ENV = "POLAR_ROLLOUT"
DEFAULT_SAMPLING = "temperature=1.0,top_p=1.0,top_k=-1"
NEEDS_TRAIN = needs_trainer_env("polar-train")
TRAIN_FIELDS = ("step", "weight_version", "samples", "statuses", "reward_mean", "reward_mean_per_group",
                "verify_median_abs_gap", "verify_share_within", "ratio_mean", "ratio_max", "clip_share", "tis_share",
                "loss", "tokens_forward", "tokens_trainable", "seconds", "reward_std", "groups",
                "groups_without_spread", "updates", "response_len", "entropy", "kl_initial", "eval_reward", "tasks", "published")
STAGES = ("rollout", "process", "verify", "train", "reload")


class BadInput(ValueError):
    """A command-line problem: one line naming the fix, exit 2."""


class StageFailed(RuntimeError):
    """A stage of a step failed: one line naming the step and the stage, exit 1."""

    def __init__(self, step: int, stage: str, why: str):
        super().__init__(f"step {step}: {stage} failed: {why}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line naming the fix, exit 2 (argparse prints usage first)
        self.exit(2, f"polar-train: {message} (see polar-train --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="polar-train", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("tasks", nargs="*", metavar="TASKS", help="Harbor task directories (required unless --resume)")
    p.add_argument("--agent", help="the agent, as polar-rollout takes it (required unless --resume)")
    p.add_argument("--model", help="the starting HF checkpoint (required unless --resume)")
    p.add_argument("--out", "-o", required=True, metavar="RUN", help="the training run directory")
    p.add_argument("--steps", type=int, default=2, help="training steps (rollout → update → reload)")
    p.add_argument("--samples", "-k", type=int, default=4, help="samples per task per step (the GRPO group size)")
    p.add_argument("--lr", type=float, default=None,
                   help="AdamW learning rate (default: picked from the model's size, see default_lr; 0: a control run "
                        "whose weights never change)")
    p.add_argument("--tasks-per-step", type=int, default=None, metavar="N",
                   help="tasks drawn (seeded) per step from TASKS (default: every task, every step)")
    p.add_argument("--mini-batches", type=int, default=None, metavar="M",
                   help="optimizer updates per pass over a step's rollouts (shuffled parts; default: picked with --lr)")
    p.add_argument("--epochs", type=int, default=None, metavar="E",
                   help="passes over a step's rollouts (default: picked with --lr)")
    p.add_argument("--seed", type=int, default=0, help="seeds the task draw, the mini-batch shuffle and torch")
    p.add_argument("--keep-checkpoints", type=int, default=None, metavar="N",
                   help="keep the newest N checkpoints (the one serving is always the newest; default: all)")
    p.add_argument("--eval-tasks", nargs="+", default=[], metavar="DIR",
                   help="held-out tasks (or folders of them): rolled out, never trained on, every --eval-every steps")
    p.add_argument("--eval-every", type=int, default=4, metavar="N",
                   help="evaluate before steps 1, 1+N, 1+2N, … and the last")
    p.add_argument("--eval-samples", type=int, default=2, metavar="K", help="samples per held-out task")
    p.add_argument("--kl-initial", action=argparse.BooleanOptionalAction, default=True,
                   help="measure KL to the initial policy (a frozen copy of --model: one no-grad forward per "
                        "micro-batch)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--clip", type=float, default=0.2, help="PPO clip ε")
    p.add_argument("--tis-cap", type=float, default=None, help="truncated importance sampling cap (default: off)")
    p.add_argument("--micro-batch-tokens", type=int, default=4096, help="tokens per micro-batch")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="serving, recompute and training dtype")
    p.add_argument("--sampling", default=DEFAULT_SAMPLING, help="the proxy's polar_sampling_override")
    p.add_argument("--rollout-cmd", default=None,
                   help=f"polar-rollout (a command line; default: ${ROLLOUT_ENV}, else polar-rollout on PATH, else "
                        "the checkout's .venv/bin/polar-rollout)")
    p.add_argument("--rollout-opt", action="append", default=[], metavar="ARG",
                   help="argument passed to polar-rollout, repeatable, e.g. --rollout-opt=--sandbox=none")
    p.add_argument("--vllm-run-file", default=None, metavar="F",
                   help="a running dev-mode vLLM serving --model (default: polar-train starts one)")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN")
    return p


# ---------------------------------------------------------------------------------------------------- the plan

@dataclass
class Plan:
    """What a run is: saved as RUN/train.json; --resume reads it back."""

    tasks: list[str]
    agent: str
    model: str
    steps: int
    samples: int
    lr: float
    weight_decay: float
    clip: float
    tis_cap: float | None
    micro_batch_tokens: int
    dtype: str
    sampling: str
    rollout_cmd: str
    rollout_opt: list[str] = field(default_factory=list)
    vllm_run_file: str | None = None
    tasks_per_step: int | None = None
    mini_batches: int = 1
    epochs: int = 1
    seed: int = 0
    keep_checkpoints: int | None = None
    eval_tasks: list[str] = field(default_factory=list)
    eval_every: int = 4
    eval_samples: int = 2
    kl_initial: bool = True
    lr_source: str = "given"
    params: int | None = None

    @classmethod
    def from_args(cls, args) -> "Plan":
        return cls(tasks=[str(Path(t).resolve()) for t in args.tasks], agent=args.agent,
                   model=str(Path(args.model).resolve()), steps=args.steps, samples=args.samples, lr=args.lr,
                   weight_decay=args.weight_decay, clip=args.clip, tis_cap=args.tis_cap,
                   micro_batch_tokens=args.micro_batch_tokens, dtype=args.dtype, sampling=args.sampling,
                   rollout_cmd=args.rollout_cmd, rollout_opt=list(args.rollout_opt),
                   vllm_run_file=str(Path(args.vllm_run_file).resolve()) if args.vllm_run_file else None,
                   tasks_per_step=args.tasks_per_step, mini_batches=args.mini_batches, epochs=args.epochs,
                   seed=args.seed, keep_checkpoints=args.keep_checkpoints,
                   eval_tasks=[str(Path(t).resolve()) for t in args.eval_tasks], eval_every=args.eval_every,
                   eval_samples=args.eval_samples, kl_initial=args.kl_initial, lr_source=args.lr_source,
                   params=args.params)


# The learning rate when --lr is not given (measured on the tiny model: docs/training.md, "Measured"): a
# small randomly initialised model learns a graded answer family at 1e-2 with 2 mini-batches × 4 epochs (8 updates
# per rollout batch; 4 updates learn too, more slowly) and does not at 1e-3 with one; a pretrained model of ~10^8
# parameters and more takes 1e-5 · sqrt(1e9 / params), within [1e-6, 5e-5], one update per batch (2.7e-5 for
# SmolLM2-135M: the usual RL fine-tuning range, not measured to learn here).
SMALL_MODEL_PARAMS = 20_000_000
SMALL_MODEL_LR, SMALL_MODEL_MINI_BATCHES, SMALL_MODEL_EPOCHS = 1e-2, 2, 4


def count_params(model_dir: str | Path) -> int | None:
    """Parameters in the model's *.safetensors (their headers only: no torch), None when there is none."""
    import struct

    total, found = 0, False
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                size = 1
                for d in t.get("shape") or []:
                    size *= int(d)
                total += size
                found = True
    return total if found else None


def default_lr(params: int | None) -> tuple[float, int, int, str]:
    """(learning rate, mini-batches, epochs, why) for a model of `params` parameters."""
    if params is not None and params < SMALL_MODEL_PARAMS:
        return SMALL_MODEL_LR, SMALL_MODEL_MINI_BATCHES, SMALL_MODEL_EPOCHS, (
            f"{params / 1e6:.1f}M parameters < {SMALL_MODEL_PARAMS / 1e6:.0f}M: a small model")
    n = params or 1_000_000_000
    lr = min(max(1e-5 * (1e9 / n) ** 0.5, 1e-6), 5e-5)
    return float(f"{lr:.2g}"), 1, 1, f"{n / 1e6:.0f}M parameters: 1e-5·sqrt(1e9/params)"


def check_args(args) -> None:
    for name in ("steps", "samples", "micro_batch_tokens", "eval_every", "eval_samples"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} {getattr(args, name)}: must be ≥ 1")
    for name in ("tasks_per_step", "mini_batches", "epochs", "keep_checkpoints"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} {getattr(args, name)}: must be ≥ 1")
    if args.samples < 2:
        raise BadInput(f"--samples {args.samples}: a GRPO group needs ≥ 2 samples")
    if (args.lr is not None and args.lr < 0) or args.clip <= 0 or (args.tis_cap is not None and args.tis_cap <= 0):
        raise BadInput("--lr must be ≥ 0, --clip and --tis-cap > 0")
    out = Path(args.out)
    if args.resume:
        if not (out / "train.json").is_file():
            raise BadInput(f"--resume: {out} holds no polar-train run (no train.json)")
        return
    if not args.tasks or not args.agent or not args.model:
        raise BadInput("TASKS, --agent and --model are required (or --resume an existing RUN)")
    if out.exists() and any(out.iterdir()):
        raise BadInput(f"{out} is not empty: pass a new --out, or --resume")
    if not (Path(args.model) / "config.json").is_file():
        raise BadInput(f"--model {args.model}: not an HF checkpoint (no config.json)")
    for t in [*args.tasks, *args.eval_tasks]:
        if not Path(t).exists():
            raise BadInput(f"task {t} does not exist")
    if not task_dirs(args.tasks):
        raise BadInput(f"no Harbor task (a directory with task.toml) in {' '.join(args.tasks)}")
    if args.eval_tasks and not task_dirs(args.eval_tasks):
        raise BadInput(f"--eval-tasks: no Harbor task in {' '.join(args.eval_tasks)}")
    args.params = count_params(args.model)
    lr, mini, epochs, why = default_lr(args.params)
    if args.lr is None:
        args.lr, args.lr_source = lr, f"picked: {why}"
        args.mini_batches = mini if args.mini_batches is None else args.mini_batches
        args.epochs = epochs if args.epochs is None else args.epochs
    else:
        args.lr_source = "given"
    args.mini_batches = 1 if args.mini_batches is None else args.mini_batches
    args.epochs = 1 if args.epochs is None else args.epochs
    if args.vllm_run_file and not Path(args.vllm_run_file).is_file():
        raise BadInput(f"--vllm-run-file {args.vllm_run_file}: no such file ({launch_vllm.command()} start --dev "
                       f"writes it)")
    args.rollout_cmd = rollout_command(args.rollout_cmd)


def task_dirs(paths: list[str]) -> list[str]:
    """Every Harbor task in `paths`: a directory with task.toml, or the task directories directly inside one (a
    task family's folder), in name order."""
    found: list[str] = []
    for t in paths:
        d = Path(t)
        if (d / "task.toml").is_file():
            found.append(str(d.resolve()))
        elif d.is_dir():
            found += [str(c.resolve()) for c in sorted(d.iterdir()) if (c / "task.toml").is_file()]
    return found


def tasks_of_step(plan: "Plan", step: int) -> list[str]:
    """The tasks step `step` trains on: every task, or --tasks-per-step of them drawn without replacement by a
    generator seeded with (seed, step) — the same draw on --resume."""
    import random

    every = task_dirs(plan.tasks)
    n = plan.tasks_per_step
    if not n or n >= len(every):
        return every
    return sorted(random.Random(f"{plan.seed}:{step}").sample(every, n))


def rollout_command(given: str | None) -> str:
    """polar-rollout as a command line: `given` (--rollout-cmd), else $POLAR_ROLLOUT, else polar-rollout on PATH,
    else the checkout's .venv/bin/polar-rollout; BadInput naming them when none is there."""
    chosen, where = (given, "--rollout-cmd") if given else (os.environ.get(ROLLOUT_ENV), ROLLOUT_ENV)
    if chosen:
        cmd = shlex.split(chosen)
        if not cmd or shutil.which(cmd[0]) is None:
            raise BadInput(f"{where} {chosen!r}: not found (scripts/setup makes .venv/bin/polar-rollout)")
        return chosen
    found = shutil.which("polar-rollout")
    # The trainer's own environment may hold a polar-rollout that cannot start a proxy (no mitmproxy: Python 3.11)
    if found and Path(found).resolve().parent == Path(sys.prefix, "bin").resolve() \
            and importlib.util.find_spec("mitmproxy") is None:
        found = None
    root = paths.checkout_root()
    if not found and root is not None and (root / ".venv" / "bin" / "polar-rollout").exists():
        found = str(root / ".venv" / "bin" / "polar-rollout")
    if not found:
        raise BadInput(f"polar-rollout not found: pass --rollout-cmd CMD, set {ROLLOUT_ENV}, or put it on PATH (a "
                       f"checkout's scripts/setup makes .venv/bin/polar-rollout)")
    return shlex.quote(found)


# ---------------------------------------------------------------------------------------------------- vLLM

def _say(msg: str) -> None:
    print(f"polar-train: vllm: {msg}", file=sys.stderr, flush=True)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or ["no message"])[0]


def server_info(run_file: str) -> VllmRunFile:
    info = launch_vllm.read_run_file(run_file)
    if info is None:
        raise StageFailed(0, "vllm", f"{run_file}: no vLLM run file")
    return info


def start_server(plan: Plan, run: Path) -> tuple[str, bool]:
    """(run file, started by us): the server named by --vllm-run-file, or a new dev-mode one."""
    if plan.vllm_run_file:
        info = launch_vllm.read_run_file(plan.vllm_run_file)
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
    return server_info(run_file).base_url


def reload(step: int, run_file: str, weights: Path, version: str) -> float:
    t0 = time.monotonic()
    try:
        done = publishing.publish([run_file], weights, version, log=_say)
    except launch_vllm.Fail as exc:
        raise StageFailed(step, "reload", _first_line(exc)) from None
    if done.problems:
        raise StageFailed(step, "reload", done.problems[0])
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------------- one step

def step_dir(run: Path, step: int) -> Path:
    return run / "steps" / f"{step:04d}"


def version_of(step: int) -> str:
    return f"step-{step:04d}"


def eval_dir(run: Path, step: int) -> Path:
    return run / "evals" / f"{step:04d}"


def rollout_cmd(plan: Plan, run: Path, step: int, url: str, out: Path, tasks: list[str], samples: int,
                run_id: str) -> list[str]:
    """polar-rollout's command line for one RUN (continued with --resume when it already exists)."""
    cmd = shlex.split(plan.rollout_cmd)
    if (out / "run.json").is_file():
        cmd += ["--resume", "--out", str(out)]
    else:
        cmd += [*tasks, "--agent", plan.agent, "--out", str(out), "--samples", str(samples),
                "--run-id", run_id, "--upstream", url,
                "--proxy-set", "polar_exact=true", "--proxy-set", f"polar_sampling_override={plan.sampling}",
                # the model's own tokenizer names its end-of-turn ids: a step whose completions all ran into
                # max_tokens (a random policy's) has no natural stop to take them from
                f"--process-opt=--tokenizer={plan.model}", *plan.rollout_opt]
    return cmd


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("HTTPS_PROXY", "https_proxy", "VIRTUAL_ENV")}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "a", encoding="utf-8")
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    finally:
        log.close()


def rollout(plan: Plan, run: Path, step: int, url: str, evaluate: bool = False) -> tuple[dict, float, dict | None]:
    """polar-rollout for the step's tasks (and, with `evaluate`, at the same time for the held-out tasks: no
    update follows from those); (its run.json, seconds, the evaluation's rewards or None)."""
    out = step_dir(run, step)
    t0 = time.monotonic()
    proc = _spawn(rollout_cmd(plan, run, step, url, out, tasks_of_step(plan, step), plan.samples,
                              f"{run.name}-{version_of(step)}"), run / "steps" / f"{step:04d}.log")
    ev = None
    if evaluate:
        ev_out = eval_dir(run, step)
        ev = _spawn(rollout_cmd(plan, run, step, url, ev_out, task_dirs(plan.eval_tasks), plan.eval_samples,
                                f"{run.name}-eval-{step:04d}") + ["--no-process"], run / "evals" / f"{step:04d}.log")
    try:
        code = proc.wait()
        seconds = time.monotonic() - t0
        ev_code = ev.wait() if ev is not None else None
    except BaseException:
        for pr in (proc, ev):
            if pr is not None and pr.poll() is None:
                pr.terminate()
        raise
    if code != 0 or not (out / "run.json").is_file():
        raise StageFailed(step, "rollout", f"polar-rollout exit {code} (log: {run}/steps/{step:04d}.log)")
    evaluation = None
    if ev is not None:
        if ev_code != 0 or not (eval_dir(run, step) / "results.jsonl").is_file():
            raise StageFailed(step, "evaluation", f"polar-rollout exit {ev_code} (log: {run}/evals/{step:04d}.log)")
        evaluation = rewards_of(eval_dir(run, step))
    doc = json.loads((out / "run.json").read_text())
    processed = doc.get("processed") or {}
    if processed.get("exit") != 0 or not (out / "out" / "batches").is_dir():
        raise StageFailed(step, "process", f"polar-process exit {processed.get('exit')} ({out}/process.log)")
    return doc, seconds, evaluation


def rewards_of(out: Path) -> dict:
    """The step's results.jsonl (latest attempts): samples, statuses, reward_mean, reward_std (over every rewarded
    sample), reward_mean_per_group, groups, groups_without_spread (fewer than 2 rewards, or all equal: every
    advantage of the group is 0)."""
    latest: dict = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        if line.strip():
            doc = json.loads(line)
            latest[(doc["task"], doc["k"])] = doc
    statuses: dict[str, int] = {}
    groups: dict[str, list[float]] = {}
    for doc in latest.values():
        statuses[doc["status"]] = statuses.get(doc["status"], 0) + 1
        if doc.get("reward") is not None:
            groups.setdefault(doc["group"], []).append(float(doc["reward"]))
    every = [r for rs in groups.values() for r in rs]
    per_group = {g: sum(rs) / len(rs) for g, rs in sorted(groups.items())}
    mean = sum(every) / len(every) if every else None
    std = (sum((r - mean) ** 2 for r in every) / len(every)) ** 0.5 if every else None
    flat = sum(1 for rs in groups.values() if len(rs) < 2 or max(rs) - min(rs) <= 1e-12)
    return {"samples": len(latest), "statuses": statuses, "reward_mean": mean, "reward_std": std,
            "reward_mean_per_group": per_group, "groups": len(groups), "groups_without_spread": flat}


def verify(step: int, out: Path, weights: str, dtype: str) -> tuple[dict, float]:
    from polar.trainer import verify as verifier

    t0 = time.monotonic()
    code = verifier.main([str(out), "--model", weights, "--dtype", dtype, "--max-median", "0"])
    if code == 2:
        raise StageFailed(step, "verify", f"polar-verify {out} --model {weights}: bad input (see above)")
    report = json.loads((out / "report.json").read_text())
    return report.get("verify") or {}, time.monotonic() - t0


def load_batches(step: int, trainer: "Trainer", out: Path, required: bool = True):
    from polar.trainer.loader import micro_batches

    # a context_mismatch sequence's recorded logprobs were sampled under another context than the one it holds:
    # they are no π_old for it (slime drops such samples too: remove_sample)
    batches = micro_batches(str(out / "batches"), trainer.plan.micro_batch_tokens, layout="per_sequence",
                            leave_out_flags=("context_mismatch",))
    if required and not batches.counts.get("tokens_trainable"):
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
        if m.tokens_trainable:
            m.entropy, m.kl_initial = grpo._measure(trainer.model, batches, trainer.reference)
        return m.as_dict()
    metrics = grpo.grpo_update(trainer.model, trainer.optimizer, batches, trainer.config,
                               mini_batches=plan.mini_batches, epochs=plan.epochs, seed=plan.seed * 1_000_003 + step,
                               reference=trainer.reference)
    return metrics.as_dict()


@dataclass
class Trainer:
    """The policy in memory, its optimizer (carried over from step to step) and the GRPO settings."""

    plan: Plan
    model: object
    optimizer: object
    config: object
    reference: object = None  # the initial policy, frozen (--kl-initial)

    @classmethod
    def load(cls, plan: Plan, weights: str) -> "Trainer":
        import random

        import torch
        from polar.trainer import grpo
        from polar.trainer.recompute import load_model

        random.seed(plan.seed)
        torch.manual_seed(plan.seed)
        config = grpo.GrpoConfig(lr=plan.lr, clip=plan.clip, tis_cap=plan.tis_cap, weight_decay=plan.weight_decay)
        model = load_model(weights, plan.dtype)
        model.requires_grad_(True)
        reference = None
        if plan.kl_initial:
            reference = load_model(plan.model, plan.dtype)
            reference.requires_grad_(False)
        return cls(plan=plan, model=model, optimizer=grpo.make_optimizer(model, config), config=config,
                   reference=reference)


def evaluates(plan: Plan, step: int) -> bool:
    """Whether the held-out tasks are rolled out at this step (before its update): steps 1, 1+N, 1+2N, … and the
    last."""
    return bool(plan.eval_tasks) and ((step - 1) % plan.eval_every == 0 or step == plan.steps)


def run_step(step: int, trainer: Trainer, run: Path, run_file: str, weights: str) -> dict:
    """Rollout → verify → train → checkpoint → reload; the step's train.jsonl line. A step where no group has a
    reward spread (every advantage 0) makes no update; one whose update cannot change the weights (--lr 0) keeps
    them: either way no checkpoint and no publication — the same version keeps serving."""
    from polar.trainer.checkpoint import save_checkpoint

    plan = trainer.plan
    serving = server_info(run_file).weight_version
    doc, t_rollout, evaluation = rollout(plan, run, step, base_url(run_file), evaluates(plan, step))
    out = step_dir(run, step) / "out"
    t_process = float((doc.get("processed") or {}).get("seconds") or 0.0)
    r = rewards_of(step_dir(run, step))
    summary, t_verify = verify(step, out, weights, plan.dtype)
    t0 = time.monotonic()
    spread = r["groups"] > r["groups_without_spread"]
    batches = load_batches(step, trainer, out, required=spread)
    signal = spread and has_advantage(batches)
    m = train_step(step, trainer, out, batches, update=signal)
    publish = signal and plan.lr > 0
    ckpt = Path(weights)
    if publish:
        ckpt = run / "checkpoints" / version_of(step)
        save_checkpoint(trainer.model, str(ckpt), plan.model)
    t_train = time.monotonic() - t0
    t_reload = reload(step, run_file, ckpt, version_of(step)) if publish else 0.0
    after = version_of(step) if publish else serving
    why = None if publish else ("no reward spread: no update" if not signal else "--lr 0: weights unchanged")
    if publish and plan.keep_checkpoints:
        prune_checkpoints(run, plan.keep_checkpoints, keep=ckpt)
    return {"step": step, "weight_version": serving, "samples": r["samples"], "statuses": r["statuses"],
            "reward_mean": r["reward_mean"], "reward_mean_per_group": r["reward_mean_per_group"],
            "reward_std": r["reward_std"], "groups": r["groups"], "groups_without_spread": r["groups_without_spread"],
            "updates": m.get("updates") or 0, "response_len": m.get("response_len"), "entropy": m.get("entropy"),
            "kl_initial": m.get("kl_initial"),
            "eval_reward": evaluation["reward_mean"] if evaluation else None,
            "eval_samples": evaluation["samples"] if evaluation else None,
            "tasks": [Path(t).name for t in tasks_of_step(plan, step)],
            "published": publish, "serving_after": after, "no_publication": why,
            "verify_median_abs_gap": summary.get("median_abs_gap"),
            "verify_share_within": summary.get("share_within"), "ratio_mean": m.get("ratio_mean"),
            "ratio_max": m.get("ratio_max"), "clip_share": m.get("clip_share"), "tis_share": m.get("tis_share"),
            "loss": m.get("loss"), "tokens_forward": m.get("tokens_forward"),
            "tokens_trainable": m.get("tokens_trainable"),
            "seconds": {"rollout": round(t_rollout - t_process, 2), "process": round(t_process, 2),
                        "verify": round(t_verify, 2), "train": round(t_train, 2), "reload": round(t_reload, 2)},
            "checkpoint": str(ckpt), "first_ratio_max_dev": m.get("first_ratio_max_dev"),
            "grad_norm": m.get("grad_norm"), "left_out": m.get("left_out")}


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
    from polar.trainer.report import write_report

    lines = read_lines(run)
    done = max((ln["step"] for ln in lines), default=0)
    weights = plan.model if done == 0 else lines[-1].get("checkpoint") or str(run / "checkpoints" / version_of(done))
    version = version_of(done) if done == 0 else lines[-1].get("serving_after") or version_of(done)
    print(f"polar-train: lr {plan.lr:g} ({plan.lr_source}), {plan.mini_batches} mini-batch(es) × {plan.epochs} "
          f"epoch(s) per step, seed {plan.seed}, {len(task_dirs(plan.tasks))} task(s)"
          + (f", {plan.tasks_per_step} per step" if plan.tasks_per_step else ""), file=sys.stderr, flush=True)
    run_file, ours = start_server(plan, run)
    try:
        # the server serves exactly the weights the trainer starts from, under a version of this run (step-0000:
        # --model; on --resume the last checkpoint), whatever it served before
        reload(done, run_file, Path(weights), version)
        trainer = Trainer.load(plan, weights)
        for step in range(done + 1, plan.steps + 1):
            line = run_step(step, trainer, run, run_file, weights)
            append_line(run, line)
            weights = line["checkpoint"]
            write_report(run, read_lines(run))
            print(step_summary(line), file=sys.stderr, flush=True)
    finally:
        if ours:
            launch_vllm.stop(run_file, log=_say)
    write_report(run, read_lines(run))
    return 0


def step_summary(ln: dict) -> str:
    fmt = lambda x, f=".3f": "n/a" if x is None else format(x, f)  # noqa: E731
    s = ln["seconds"]
    return (f"polar-train: step {ln['step']} (weights {ln['weight_version']}): {ln['samples']} samples "
            f"{ln['statuses']}, reward mean {fmt(ln['reward_mean'])}; verify median |gap| "
            f"{fmt(ln['verify_median_abs_gap'], '.2g')}, within {fmt(ln['verify_share_within'])}; ratio mean "
            f"{fmt(ln['ratio_mean'], '.4f')} max {fmt(ln['ratio_max'], '.4f')}, clip {fmt(ln['clip_share'])}, loss "
            f"{fmt(ln['loss'], '.4g')}; {ln['tokens_trainable']} trainable of {ln['tokens_forward']} tokens; "
            f"{' '.join(f'{k} {v:.1f}s' for k, v in s.items())}"
            f"; spread {fmt(ln.get('reward_std'))}, {ln.get('groups_without_spread')} of {ln.get('groups')} group(s) "
            f"without spread, {ln.get('updates')} update(s), entropy {fmt(ln.get('entropy'))}, KL to initial "
            f"{fmt(ln.get('kl_initial'), '.3g')}"
            + (f", eval reward {fmt(ln['eval_reward'])}" if ln.get("eval_reward") is not None else "")
            + (f"; {ln['no_publication']}, {ln['serving_after']} keeps serving" if ln.get("no_publication") else ""))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
    print(f"polar-train: {plan.steps} step(s) done: {run}/train.jsonl, {run}/report.html", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
