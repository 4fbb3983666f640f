"""polar-train TASKS... --agent AGENT --model DIR --out RUN (DESIGN §10): the closed loop, one step at a time.

Each step N (RUN/steps/000N/ is a polar-rollout RUN):
1. rollout — `polar-rollout` (the proxy's environment, `--rollout-cmd`) runs K samples of the unmodified agent per
   task behind a proxy of its own, in exact mode, with sampling pinned (`polar_sampling_override=temperature=1.0,
   top_p=1.0,top_k=-1` unless `--sampling` says otherwise), against the vLLM that serves the current weights; it
   verifies them, writes rewards and groups, and processes the records (RUN/steps/000N/out).
2. verify — `polar-verify` on that output with the checkpoint that served it: the sampler's logprobs against a
   transformers recompute (reported; a bound exceeded is a warning, not a failed stage).
3. train — one reference GRPO step (`polar.trainer.grpo`: token-sum normalisation over the whole step, π_old = the
   recorded logprobs) over the step's micro-batches; the optimizer state carries over from step to step.
4. checkpoint — a complete HF directory, RUN/checkpoints/step-000N/.
5. reload — `scripts/vllm reload --weights RUN/checkpoints/step-000N --version step-000N`: the next rollouts are
   served by the new weights (their records carry weight_version step-000N). Before step 1 the server is reloaded
   with `--model` as step-0000, so every record of the run names the weights that sampled it.
One line per step in RUN/train.jsonl (TRAIN_FIELDS); RUN/report.html draws the loop's curves.

The vLLM: `--vllm-run-file F` names a running dev-mode server (`scripts/vllm start --dev`) that serves `--model`;
without it polar-train starts one (`--dtype`, dev mode) with its run file RUN/vllm.json and stops it at the end.
`--resume` continues a RUN: the steps in train.jsonl stay, the model and the server go to the last checkpoint, and an
unfinished step's rollout continues (`polar-rollout --resume`).
Exit 0 every step ran; 1 a stage failed (one line names the step and the stage); 2 bad input (one line names the fix).
torch is imported after the arguments are checked.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from polar.trainer import has_trainer_env, needs_trainer_env

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS_VLLM = ROOT / "scripts" / "vllm"
DEFAULT_ROLLOUT = str(ROOT / ".venv" / "bin" / "polar-rollout")
DEFAULT_SAMPLING = "temperature=1.0,top_p=1.0,top_k=-1"
NEEDS_TRAIN = needs_trainer_env("polar-train")
TRAIN_FIELDS = ("step", "weight_version", "samples", "statuses", "reward_mean", "reward_mean_per_group",
                "verify_median_abs_gap", "verify_share_within", "ratio_mean", "ratio_max", "clip_share", "tis_share",
                "loss", "tokens_forward", "tokens_trainable", "seconds")
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
    p.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--clip", type=float, default=0.2, help="PPO clip ε")
    p.add_argument("--tis-cap", type=float, default=None, help="truncated importance sampling cap (default: off)")
    p.add_argument("--micro-batch-tokens", type=int, default=4096, help="tokens per micro-batch")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="serving, recompute and training dtype")
    p.add_argument("--sampling", default=DEFAULT_SAMPLING, help="the proxy's polar_sampling_override")
    p.add_argument("--rollout-cmd", default=DEFAULT_ROLLOUT, help="polar-rollout (a command line)")
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

    @classmethod
    def from_args(cls, args) -> "Plan":
        return cls(tasks=[str(Path(t).resolve()) for t in args.tasks], agent=args.agent,
                   model=str(Path(args.model).resolve()), steps=args.steps, samples=args.samples, lr=args.lr,
                   weight_decay=args.weight_decay, clip=args.clip, tis_cap=args.tis_cap,
                   micro_batch_tokens=args.micro_batch_tokens, dtype=args.dtype, sampling=args.sampling,
                   rollout_cmd=args.rollout_cmd, rollout_opt=list(args.rollout_opt),
                   vllm_run_file=str(Path(args.vllm_run_file).resolve()) if args.vllm_run_file else None)


def check_args(args) -> None:
    for name in ("steps", "samples", "micro_batch_tokens"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} {getattr(args, name)}: must be ≥ 1")
    if args.samples < 2:
        raise BadInput(f"--samples {args.samples}: a GRPO group needs ≥ 2 samples")
    if not args.lr > 0 or args.clip <= 0 or (args.tis_cap is not None and args.tis_cap <= 0):
        raise BadInput("--lr, --clip and --tis-cap must be > 0")
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
    for t in args.tasks:
        if not Path(t).exists():
            raise BadInput(f"task {t} does not exist")
    if args.vllm_run_file and not Path(args.vllm_run_file).is_file():
        raise BadInput(f"--vllm-run-file {args.vllm_run_file}: no such file (scripts/vllm start --dev writes it)")
    cmd = shlex.split(args.rollout_cmd)
    if not cmd or shutil.which(cmd[0]) is None:
        raise BadInput(f"--rollout-cmd {args.rollout_cmd!r}: not found (scripts/setup makes .venv/bin/polar-rollout)")


# ---------------------------------------------------------------------------------------------------- vLLM

def _vllm(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS_VLLM), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def start_server(plan: Plan, run: Path) -> tuple[str, bool]:
    """(run file, started by us): the server named by --vllm-run-file, or a new dev-mode one."""
    if plan.vllm_run_file:
        doc = json.loads(Path(plan.vllm_run_file).read_text())
        if not doc.get("dev"):
            raise BadInput(f"--vllm-run-file {plan.vllm_run_file}: that server is not in dev mode (scripts/vllm "
                           "start --dev): it cannot reload weights")
        return plan.vllm_run_file, False
    run_file = run / "vllm.json"
    if run_file.is_file():  # --resume: the server a previous attempt started, if it still runs
        if _vllm("status", "--run-file", str(run_file), timeout=30).returncode == 0:
            return str(run_file), True
        run_file.unlink()
    proc = _vllm("start", "--model", plan.model, "--dtype", plan.dtype, "--dev", "--run-file", str(run_file),
                 timeout=900)
    if proc.returncode != 0:
        raise StageFailed(0, "vllm start", (proc.stderr.strip().splitlines() or ["no message"])[-1])
    return str(run_file), True


def base_url(run_file: str) -> str:
    return json.loads(Path(run_file).read_text())["base_url"]


def reload(step: int, run_file: str, weights: Path, version: str) -> float:
    t0 = time.monotonic()
    proc = _vllm("reload", "--weights", str(weights), "--version", version, "--run-file", run_file, timeout=600)
    if proc.returncode != 0:
        raise StageFailed(step, "reload", (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1])
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------------- one step

def step_dir(run: Path, step: int) -> Path:
    return run / "steps" / f"{step:04d}"


def version_of(step: int) -> str:
    return f"step-{step:04d}"


def rollout(plan: Plan, run: Path, step: int, url: str) -> tuple[dict, float]:
    """polar-rollout for the step (continued with --resume when its RUN already exists); (its run.json, seconds)."""
    out = step_dir(run, step)
    cmd = shlex.split(plan.rollout_cmd)
    if (out / "run.json").is_file():
        cmd += ["--resume", "--out", str(out)]
    else:
        cmd += [*plan.tasks, "--agent", plan.agent, "--out", str(out), "--samples", str(plan.samples),
                "--run-id", f"{run.name}-{version_of(step)}", "--upstream", url,
                "--proxy-set", "polar_exact=true", "--proxy-set", f"polar_sampling_override={plan.sampling}",
                # the model's own tokenizer names its end-of-turn ids: a step whose completions all ran into
                # max_tokens (a random policy's) has no natural stop to take them from
                f"--process-opt=--tokenizer={plan.model}", *plan.rollout_opt]
    t0 = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("HTTPS_PROXY", "https_proxy", "VIRTUAL_ENV")}
    with open(run / "steps" / f"{step:04d}.log", "a", encoding="utf-8") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - t0
    if proc.returncode != 0 or not (out / "run.json").is_file():
        raise StageFailed(step, "rollout", f"polar-rollout exit {proc.returncode} (log: {run}/steps/{step:04d}.log)")
    doc = json.loads((out / "run.json").read_text())
    processed = doc.get("processed") or {}
    if processed.get("exit") != 0 or not (out / "out" / "batches").is_dir():
        raise StageFailed(step, "process", f"polar-process exit {processed.get('exit')} ({out}/process.log)")
    return doc, seconds


def rewards_of(out: Path) -> tuple[int, dict, float | None, dict]:
    """(samples, statuses, mean reward, mean reward per group) from the step's results.jsonl (latest attempts)."""
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
    return len(latest), statuses, (sum(every) / len(every) if every else None), per_group


def verify(step: int, out: Path, weights: str, dtype: str) -> tuple[dict, float]:
    from polar.trainer import verify as verifier

    t0 = time.monotonic()
    code = verifier.main([str(out), "--model", weights, "--dtype", dtype, "--max-median", "0"])
    if code == 2:
        raise StageFailed(step, "verify", f"polar-verify {out} --model {weights}: bad input (see above)")
    report = json.loads((out / "report.json").read_text())
    return report.get("verify") or {}, time.monotonic() - t0


def train_step(step: int, trainer: "Trainer", out: Path) -> dict:
    from polar.trainer import grpo
    from polar.trainer.loader import micro_batches

    # a context_mismatch sequence's recorded logprobs were sampled under another context than the one it holds:
    # they are no π_old for it (slime drops such samples too: remove_sample)
    batches = micro_batches(str(out / "batches"), trainer.plan.micro_batch_tokens, layout="per_sequence",
                            leave_out_flags=("context_mismatch",))
    if not batches.counts.get("tokens_trainable"):
        raise StageFailed(step, "train", f"no trainable token in {out}/batches ({batches.counts})")
    metrics = grpo.grpo_step(trainer.model, trainer.optimizer, batches, trainer.config)
    return metrics.as_dict()


@dataclass
class Trainer:
    """The policy in memory, its optimizer (carried over from step to step) and the GRPO settings."""

    plan: Plan
    model: object
    optimizer: object
    config: object

    @classmethod
    def load(cls, plan: Plan, weights: str) -> "Trainer":
        from polar.trainer import grpo
        from polar.trainer.recompute import load_model

        config = grpo.GrpoConfig(lr=plan.lr, clip=plan.clip, tis_cap=plan.tis_cap, weight_decay=plan.weight_decay)
        model = load_model(weights, plan.dtype)
        model.requires_grad_(True)
        return cls(plan=plan, model=model, optimizer=grpo.make_optimizer(model, config), config=config)


def run_step(step: int, trainer: Trainer, run: Path, run_file: str, weights: str) -> dict:
    """Rollout → verify → train → checkpoint → reload; the step's train.jsonl line."""
    from polar.trainer.checkpoint import save_checkpoint

    plan = trainer.plan
    serving = json.loads(Path(run_file).read_text()).get("weight_version")
    doc, t_rollout = rollout(plan, run, step, base_url(run_file))
    out = step_dir(run, step) / "out"
    t_process = float((doc.get("processed") or {}).get("seconds") or 0.0)
    samples, statuses, reward_mean, per_group = rewards_of(step_dir(run, step))
    summary, t_verify = verify(step, out, weights, plan.dtype)
    t0 = time.monotonic()
    m = train_step(step, trainer, out)
    ckpt = run / "checkpoints" / version_of(step)
    save_checkpoint(trainer.model, str(ckpt), plan.model)
    t_train = time.monotonic() - t0
    t_reload = reload(step, run_file, ckpt, version_of(step))
    return {"step": step, "weight_version": serving, "samples": samples, "statuses": statuses,
            "reward_mean": reward_mean, "reward_mean_per_group": per_group,
            "verify_median_abs_gap": summary.get("median_abs_gap"),
            "verify_share_within": summary.get("share_within"), "ratio_mean": m.get("ratio_mean"),
            "ratio_max": m.get("ratio_max"), "clip_share": m.get("clip_share"), "tis_share": m.get("tis_share"),
            "loss": m.get("loss"), "tokens_forward": m.get("tokens_forward"),
            "tokens_trainable": m.get("tokens_trainable"),
            "seconds": {"rollout": round(t_rollout - t_process, 2), "process": round(t_process, 2),
                        "verify": round(t_verify, 2), "train": round(t_train, 2), "reload": round(t_reload, 2)},
            "checkpoint": str(ckpt), "first_ratio_max_dev": m.get("first_ratio_max_dev"),
            "grad_norm": m.get("grad_norm"), "left_out": m.get("left_out")}


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
    weights = plan.model if done == 0 else str(run / "checkpoints" / version_of(done))
    run_file, ours = start_server(plan, run)
    try:
        # the server serves exactly the weights the trainer starts from, under a version of this run (step-0000:
        # --model; on --resume the last checkpoint), whatever it served before
        reload(done, run_file, Path(weights), version_of(done))
        trainer = Trainer.load(plan, weights)
        for step in range(done + 1, plan.steps + 1):
            line = run_step(step, trainer, run, run_file, weights)
            append_line(run, line)
            weights = line["checkpoint"]
            write_report(run, read_lines(run))
            print(step_summary(line), file=sys.stderr, flush=True)
    finally:
        if ours:
            _vllm("stop", "--run-file", run_file, timeout=120)
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
            f"{' '.join(f'{k} {v:.1f}s' for k, v in s.items())}")


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
