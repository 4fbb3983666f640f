"""What a polar-train run is (docs/architecture.md#the-trainer-side): its command line, the checks of it, the `Plan`
saved as RUN/train.json (read back by --resume), the learning-rate default picked from the model's size, and which
tasks each step draws. No torch here: the arguments are checked before the trainer's environment is needed."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from polar.launch import paths
from polar.launch import vllm as launch_vllm
from polar.trainer.args import OneLineParser

ROLLOUT_ENV = "POLAR_ROLLOUT"
ADVANTAGE_NORMS = ("std", "mean")  # polar-process --advantage-norm's choices (its processor owns the rule)
NORMALIZE = ("token", "rollout")  # polar.trainer.grpo's loss weights (GrpoConfig.normalize)
DEFAULT_SAMPLING = "temperature=1.0,top_p=1.0,top_k=-1"
DESCRIPTION = ("polar-train TASKS... --agent AGENT --model DIR --out RUN (docs/architecture.md#the-trainer-side): the "
               "closed loop, one step at a time.")


class BadInput(ValueError):
    """A command-line problem: one line naming the fix, exit 2."""


class StageFailed(RuntimeError):
    """A stage of a step failed: one line naming the step and the stage, exit 1."""

    def __init__(self, step: int, stage: str, why: str):
        super().__init__(f"step {step}: {stage} failed: {why}")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="polar-train", description=DESCRIPTION,
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
    p.add_argument("--clip", type=float, default=0.2, help="PPO clip ε (the low side: r ≥ 1 − ε)")
    p.add_argument("--clip-high", type=float, default=None, metavar="E",
                   help="the clip's high side ε_high (r ≤ 1 + ε_high; clip-higher, DAPO: 0.28) (default: --clip)")
    p.add_argument("--entropy-coef", type=float, default=0.0, metavar="C",
                   help="entropy bonus: loss − C · mean token entropy (TRL's entropy_coef); with --entropy-target, "
                        "its starting value")
    p.add_argument("--entropy-target", type=float, default=None, metavar="H",
                   help="adaptive entropy control (TRL's use_adaptive_entropy, entropy_target): the bonus applies "
                        "only while the last optimizer step's mean token entropy is ≤ H nats, and after each step "
                        "the coefficient moves by 0.005 within [0, 1], up at or below H, else down (default: off)")
    p.add_argument("--advantage-norm", choices=ADVANTAGE_NORMS, default="std",
                   help="the rollouts' advantages (polar-process --advantage-norm): std = (r − group mean) / group σ, "
                        "mean = r − group mean (Dr. GRPO)")
    p.add_argument("--normalize", choices=NORMALIZE, default="token",
                   help="the loss's weights: token = every trainable token of an update the same; rollout = every "
                        "session the same, however long (its tokens' mean)")
    p.add_argument("--tis-cap", type=float, default=None, help="truncated importance sampling cap (default: off)")
    p.add_argument("--micro-batch-tokens", type=int, default=4096, help="tokens per micro-batch")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="serving, recompute and training dtype")
    p.add_argument("--sampling", default=None,
                   help=f"the proxy's polar_sampling_override (default: {DEFAULT_SAMPLING},seed_per_call=SEED: each "
                        "call seeded from --seed, its session and its prompt, so a run can be drawn again)")
    p.add_argument("--rollout-cmd", default=None,
                   help=f"polar-rollout (a command line; default: ${ROLLOUT_ENV}, else polar-rollout on PATH, else "
                        "the checkout's .venv/bin/polar-rollout)")
    p.add_argument("--rollout-opt", action="append", default=[], metavar="ARG",
                   help="argument passed to polar-rollout, repeatable, e.g. --rollout-opt=--sandbox=none")
    p.add_argument("--vllm-run-file", default=None, metavar="F",
                   help="a running dev-mode vLLM serving --model, or the run file of a pool of them (polar-vllm "
                        "start --dev --replicas N: the rollouts use every replica, each step publishes to all) "
                        "(default: polar-train starts one)")
    p.add_argument("--max-staleness", type=int, default=0, metavar="N",
                   help="0: each step's rollout starts once the previous step has published (synchronous); N ≥ 1: "
                        "a step's rollout starts as soon as the previous step's is in, and runs while that step "
                        "trains — samples more than N versions behind the policy are left out (left_out_stale)")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN")
    return p


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
    max_staleness: int = 0
    clip_high: float | None = None
    entropy_coef: float = 0.0
    entropy_target: float | None = None
    advantage_norm: str = "std"
    normalize: str = "token"

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
                   params=args.params, max_staleness=args.max_staleness, clip_high=args.clip_high,
                   entropy_coef=args.entropy_coef, entropy_target=args.entropy_target,
                   advantage_norm=args.advantage_norm, normalize=args.normalize)


# The learning rate when --lr is not given (measured: docs/training.md, "Measured"): a small randomly initialised
# model learns a graded answer family at 1e-2 with 2 mini-batches × 8 epochs (16 updates per rollout batch: 9 of 10
# seeded runs rise by 0.15 in 12 steps, against 5 of 7 with 8 updates and 2 of 3 with 4) and does not at 1e-3 with
# one; a pretrained model of ~10^8 parameters and more takes
# 1e-5 · sqrt(1e9 / params), within [1e-6, 5e-5], with 2 mini-batches × 1 epoch: two updates per rollout batch for
# the compute of one pass (SmolLM2-135M, 2.5e-5: docs/training.md, "Measured: SmolLM2-135M").
SMALL_MODEL_PARAMS = 20_000_000
SMALL_MODEL_LR, SMALL_MODEL_MINI_BATCHES, SMALL_MODEL_EPOCHS = 1e-2, 2, 8
LARGE_MODEL_MINI_BATCHES = 2


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
    return float(f"{lr:.2g}"), LARGE_MODEL_MINI_BATCHES, 1, f"{n / 1e6:.0f}M parameters: 1e-5·sqrt(1e9/params)"


def check_args(args) -> None:
    for name in ("steps", "samples", "micro_batch_tokens", "eval_every", "eval_samples"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} {getattr(args, name)}: must be ≥ 1")
    if args.max_staleness < 0:
        raise BadInput(f"--max-staleness {args.max_staleness}: must be ≥ 0 (0: synchronous)")
    for name in ("tasks_per_step", "mini_batches", "epochs", "keep_checkpoints"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} {getattr(args, name)}: must be ≥ 1")
    if args.samples < 2:
        raise BadInput(f"--samples {args.samples}: a GRPO group needs ≥ 2 samples")
    if (args.lr is not None and args.lr < 0) or args.clip <= 0 or (args.tis_cap is not None and args.tis_cap <= 0):
        raise BadInput("--lr must be ≥ 0, --clip and --tis-cap > 0")
    if args.clip_high is not None and args.clip_high <= 0:
        raise BadInput(f"--clip-high {args.clip_high}: must be > 0 (or leave it out: --clip on both sides)")
    if args.entropy_coef < 0 or (args.entropy_target is not None and args.entropy_target < 0):
        raise BadInput("--entropy-coef and --entropy-target must be ≥ 0")
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
    if args.sampling is None:
        args.sampling = f"{DEFAULT_SAMPLING},seed_per_call={args.seed}"
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
            raise BadInput(f"{where} {chosen!r}: not found (" + paths.fix(
                checkout="scripts/setup makes .venv/bin/polar-rollout",
                installed="pip install 'polar-gateway[proxy,agents]' into a Python 3.12 environment") + ")")
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
        raise BadInput(f"polar-rollout not found: pass --rollout-cmd CMD, set {ROLLOUT_ENV}, or put it on PATH (" +
                       paths.fix(checkout="a checkout's scripts/setup makes .venv/bin/polar-rollout",
                                 installed="pip install 'polar-gateway[proxy,agents]' into a Python 3.12 "
                                           "environment gives one") + ")")
    return shlex.quote(found)
