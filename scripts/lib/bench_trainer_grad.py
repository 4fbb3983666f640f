"""scripts/bench_trainer's training part: one GRPO gradient (polar.trainer.grpo.policy_gradient) on the tiny model over
the per_request batches and over the prefix_merging batches of the same sessions; wall time of each and the
gradients compared.

The recorded logprobs are the tiny model's own (one float32 forward per conversation over its final history: every
call's prompt + completion is a prefix of it, so each completion token gets the logprob of exactly its context), so
every ratio is 1 and the loss is the plain policy gradient −Σ A·log π / Σ mask. Rewards 0, 1, 2 within groups of 4
give non-zero advantages.
"""

from __future__ import annotations

import time

import bench_trainer_sessions as sessions_lib
import numpy as np
import torch


def model_logprobs(model, sessions: dict[str, list[sessions_lib.Call]]) -> None:
    """Fill every call's logprobs with the model's own (see the module docstring)."""
    from polar.trainer.recompute import token_logprobs

    for calls in sessions.values():
        for convo in {c.convo for c in calls}:
            mine = [c for c in calls if c.convo == convo]
            last = mine[-1]
            full = np.concatenate([last.prompt, last.completion]).astype(np.int64)
            with torch.no_grad():
                lp = token_logprobs(model, torch.from_numpy(full)[None])[0].numpy()
            for c in mine:
                start = len(c.prompt)
                assert np.array_equal(full[:start + len(c.completion)], np.concatenate([c.prompt, c.completion]))
                c.logprobs = lp[start:start + len(c.completion)].astype(np.float32)


def _warm_up(model) -> None:
    """One untimed forward and backward, so neither timed mode pays torch's first-call costs."""
    from polar.trainer import grpo
    from polar.trainer.loader import MicroBatches, Selection, SequenceTokens

    ids = np.random.default_rng(0).integers(10, sessions_lib.VOCAB, 1024)
    mask = (np.arange(1024) >= 512).astype(np.float32)
    seq = SequenceTokens("warm-up", ids, mask, np.zeros(1024, np.float32), 1.0)
    grpo.policy_gradient(model, MicroBatches(Selection([seq], {}, []), 1024, "per_sequence"))
    model.zero_grad(set_to_none=True)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(a @ b / (a.norm() * b.norm()))


def gradients(model_dir: str, dirs: dict[str, str], budget: int, layout: str, repeats: int) -> dict:
    """Per mode: the loader's counts, every timed run's seconds, and the gradient and metrics of the last run.
    Modes alternate within each repeat, so a load change on the shared machine hits both alike."""
    from polar.trainer import grpo, loader
    from polar.trainer.recompute import load_model

    model = load_model(model_dir, "float32")
    _warm_up(model)
    out = {mode: {"seconds": []} for mode in dirs}
    for _ in range(repeats):
        for mode, batches_dir in dirs.items():
            batches = loader.micro_batches(batches_dir, budget, layout)
            started = time.perf_counter()
            metrics, grad = grpo.policy_gradient(model, batches)
            out[mode]["seconds"].append(time.perf_counter() - started)
            out[mode].update(counts=batches.counts, metrics=metrics, grad=grad.clone())
            model.zero_grad(set_to_none=True)
    return out


def compare(result: dict) -> dict:
    """The equality checks: trainable tokens, loss, gradient cosine, and the on-policy ratio."""
    a, b = result["per_request"], result["prefix_merging"]
    return {"trainable": (a["counts"]["tokens_trainable"], b["counts"]["tokens_trainable"]),
            "cosine": cosine(a["grad"], b["grad"]),
            "loss": (a["metrics"].loss, b["metrics"].loss),
            "grad_norm": (float(a["grad"].norm()), float(b["grad"].norm())),
            "ratio_max_dev": max(abs(a["metrics"].ratio_max - 1), abs(b["metrics"].ratio_max - 1)),
            "time": (min(a["seconds"]), min(b["seconds"]))}
