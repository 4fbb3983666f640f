"""TRL's GRPOTrainer trains an unmodified agent through Polar (polar.integrations.trl).

    .venv-train/bin/python examples/trl/grpo.py examples/tasks/families/digit-share/train \
        --agent python:polar.rollout.sdk_agent:answer --model .cache/models/tiny --out runs/trl
    .venv-train/bin/torchrun --nproc_per_node 2 examples/trl/grpo.py ...   # two processes (gloo on a CPU)

One round = one call of the rollout function: `--tasks-per-round` tasks × `--samples` K sessions of the agent,
then `--mini-batches` M × `--epochs` E optimizer steps of TRL over them (TRL's steps_per_generation and
num_iterations): `max_steps` = rounds × M × E. Without `--lr` the learning rate, M and E are polar-train's for the
model's size (polar.trainer.plan.default_lr). Every TRL setting that differs from TRL's and transformers' defaults is
spelled out in `config()`, with why. OUT/summary.json holds one line per round (the reward and the polar/ metrics
TRL logged) when the run ends; OUT/trl holds TRL's checkpoints (`--save-every`), which `--resume` continues from.
Exit 2 with one line for a setting PolarRollout refuses."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="examples/trl/grpo.py", description=__doc__.splitlines()[0])
    p.add_argument("tasks", nargs="+", metavar="TASKS", help="Harbor task directories, or folders of them")
    p.add_argument("--agent", required=True, help="the agent, as polar-rollout takes it")
    p.add_argument("--model", required=True, help="the HF model directory to train (and to serve)")
    p.add_argument("--out", required=True, help="the run directory")
    p.add_argument("--samples", "-k", type=int, default=4, help="K: samples per task (TRL's num_generations)")
    p.add_argument("--tasks-per-round", type=int, default=2, help="tasks per round, over all processes")
    p.add_argument("--rounds", type=int, default=12, help="rounds (rollout → M·E updates)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: polar-train's for the size)")
    p.add_argument("--mini-batches", type=int, default=None, help="optimizer steps per pass over a round (M)")
    p.add_argument("--epochs", type=int, default=None, help="passes over a round (E, TRL's num_iterations)")
    p.add_argument("--seed", type=int, default=1, help="TRL's seed: the task draw, torch, and the sampler's seeds")
    p.add_argument("--vllm", default=None, metavar="RUN_FILE",
                   help="a running dev-mode vLLM serving --model (default: one is started and stopped)")
    p.add_argument("--serve", default=None, metavar="DIR",
                   help="a running polar-rollout serve to use (default: one is started in OUT/rollout)")
    p.add_argument("--rollout-opt", action="append", default=[], metavar="ARG",
                   help="a polar-rollout argument, repeatable, e.g. --rollout-opt=--sandbox=bwrap")
    p.add_argument("--save-every", type=int, default=0, metavar="ROUNDS", help="a TRL checkpoint every N rounds")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in OUT/trl")
    p.add_argument("--no-verify", action="store_true", help="skip the on-policy check")
    return p


def config(args, world: int, mini: int, epochs: int, lr: float):
    """TRL's GRPOConfig for these arguments; each setting that is not TRL's or transformers' default says why."""
    import torch
    from trl import GRPOConfig

    on_gpu = torch.cuda.is_available()
    return GRPOConfig(
        output_dir=str(Path(args.out) / "trl"),
        use_vllm=False,  # Polar samples (the agent's own calls); TRL only trains
        num_generations=args.samples,  # one group = one task's K samples
        # one round (TRL's generation batch) = every process's groups = M optimizer steps' batches
        per_device_train_batch_size=args.tasks_per_round * args.samples // (mini * world),
        steps_per_generation=mini,  # M optimizer steps per pass over a round
        num_iterations=epochs,  # E passes over a round (π_old: TRL's forward after the rollout)
        max_steps=args.rounds * mini * epochs,
        learning_rate=lr,  # TRL: 1e-6
        lr_scheduler_type="constant",  # transformers: linear decay to 0
        warmup_steps=0,
        max_grad_norm=0.0,  # transformers: 1.0; polar-train does not clip the gradient norm
        temperature=1.0,  # the sampler's (PolarRollout refuses another)
        bf16=on_gpu,  # TRL: bf16; a CPU trains in float32 like the served weights
        gradient_checkpointing=False,  # TRL: on; a small model on a CPU does not need it
        logging_steps=1,  # transformers: 10; one line per step keeps every round's polar/ metrics
        report_to="none",
        save_strategy="steps" if args.save_every else "no",
        save_steps=max(args.save_every, 1) * mini * epochs,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=not on_gpu,  # accelerate's CPU state: with WORLD_SIZE > 1 (torchrun) its processes are one group
        ddp_backend="gloo" if world > 1 and not on_gpu else None,  # torch.distributed on a CPU
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def build(args, callbacks=()):
    """(trainer, rollout) for these arguments."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from polar.integrations.trl import PolarRollout, polar_reward, task_dataset
    from polar.trainer.plan import count_params, default_lr

    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    lr, mini, epochs, _ = default_lr(count_params(args.model))
    lr = args.lr if args.lr is not None else lr
    mini = args.mini_batches or (mini if args.lr is None else 1)
    epochs = args.epochs or (epochs if args.lr is None else 1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if torch.cuda.is_available()
                                                 else torch.float32)
    rollout = PolarRollout(args.tasks, agent=args.agent, out=args.out, samples=args.samples, vllm=args.vllm,
                           rollout_opts=args.rollout_opt, serve=args.serve, model_dir=args.model,
                           verify=not args.no_verify)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=polar_reward,
                          train_dataset=task_dataset(args.tasks), args=config(args, world, mini, epochs, lr),
                          rollout_func=rollout, callbacks=list(callbacks))
    return trainer, rollout


def rounds(log_history: list[dict]) -> list[dict]:
    """One entry per round: TRL's log line that holds the round's polar/ metrics (the first step after it)."""
    keep = ("step", "reward", "reward_std", "loss", "frac_reward_zero_std")
    return [{k: v for k, v in line.items() if k.startswith("polar/") or k in keep}
            for line in log_history if "polar/weight_version" in line]


def main(argv=None, callbacks=()) -> int:
    args = parser().parse_args(argv)
    from polar.integrations.trl import PolarRolloutError

    try:
        trainer, rollout = build(args, callbacks)
        with rollout:
            trainer.train(resume_from_checkpoint=True if args.resume else None)
    except PolarRolloutError as exc:
        print(f"examples/trl/grpo.py: {exc}", file=sys.stderr)
        return 2
    from polar.integrations.trl import params_digest

    acc = trainer.accelerator
    Path(args.out, f"params-p{acc.process_index}.sha256").write_text(params_digest(acc.unwrap_model(trainer.model)))
    if acc.is_main_process:
        lines = rounds(trainer.state.log_history)
        runtime = next((ln["train_runtime"] for ln in trainer.state.log_history if "train_runtime" in ln), None)
        Path(args.out, "summary.json").write_text(json.dumps({"args": vars(args), "world": acc.num_processes,
                                                             "train_runtime": runtime, "rounds": lines},
                                                            indent=1) + "\n")
        for line in lines:
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
