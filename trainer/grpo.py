"""The reference GRPO step (DESIGN §10): one optimizer step over all micro-batches of a rollout batch.

loss = −Σ_t m_t · w_t · min(r_t·A_t, clip(r_t, 1−ε, 1+ε)·A_t) / Σ_t m_t
- the sums run over every trainable token of the whole step (token-sum normalisation, DAPO-style): each token
  weighs the same wherever it sits, so per_request and prefix_merging batches of the same rollouts give the same
  loss and gradient when the merge is exact (reference/trainer-integration.md §4.2);
- r_t = exp(log πθ(t) − log π_old(t)), π_old = the recorded (sampler's) logprobs (bypass: no old-policy forward);
- w_t = 1, or with truncated importance sampling (cap C) w_t = min(r_t, C) / r_t, detached: the token's importance
  weight is truncated at C (the gradient of r·A is r·∇log π·A; the weight makes it min(r, C)·∇log π·A);
- m_t = the loader's loss mask: token 0 never, calls not sampled at T=1/top_p=1/top_k=-1 under raw_logprobs never
  (left out and counted by the loader), rows without advantage or logprobs not at all.
Gradients accumulate over the micro-batches (each backward divides by the step's Σ m, known before the first), then
AdamW steps once. `policy_gradient` is the same without the optimizer step (for the per_request/prefix_merging
equality check).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch
from polar.trainer.loader import MicroBatch, MicroBatches
from polar.trainer.recompute import token_logprobs


@dataclass(frozen=True)
class GrpoConfig:
    lr: float = 1e-3
    clip: float = 0.2  # ε
    tis_cap: float | None = None  # C; None = off
    weight_decay: float = 0.0
    max_grad_norm: float | None = None  # None = no clipping of the gradient norm


@dataclass
class StepMetrics:
    loss: float = 0.0
    ratio_mean: float | None = None
    ratio_max: float | None = None
    first_ratio_max_dev: float | None = None  # max |r − 1| over the first micro-batch (on-policy: ≈ 0)
    clip_share: float = 0.0  # tokens whose clipped term was taken (no gradient through r)
    tis_share: float = 0.0  # tokens whose importance weight was truncated at the cap
    tokens_forward: int = 0
    tokens_trainable: int = 0
    micro_batches: int = 0
    seconds: float = 0.0
    tokens_per_s: float | None = None
    grad_norm: float | None = None
    left_out: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def make_optimizer(model, config: GrpoConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                             weight_decay=config.weight_decay)


def token_terms(logprobs: torch.Tensor, mb: MicroBatch, config: GrpoConfig) -> tuple[torch.Tensor, dict]:
    """Per-token loss terms −w·min(r·A, clip(r)·A) (0 off the mask) and the micro-batch's ratio statistics."""
    mask = mb.loss_mask
    on = mask > 0
    ratio = torch.exp(torch.where(on, logprobs - mb.old_logprobs, torch.zeros_like(logprobs)))
    adv = mb.advantages
    clipped = torch.clamp(ratio, 1 - config.clip, 1 + config.clip)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    took_clip = on & (clipped * adv < ratio * adv)
    weight = torch.ones_like(ratio)
    truncated = torch.zeros_like(on)
    if config.tis_cap is not None:
        r = ratio.detach()
        truncated = on & (r > config.tis_cap)
        weight = torch.where(truncated, config.tis_cap / r, weight)
    terms = -(weight * surrogate) * mask
    r_on = ratio.detach()[on]
    stats = {"ratio_sum": float(r_on.sum()), "ratio_max": float(r_on.max()) if r_on.numel() else None,
             "ratio_max_dev": float((r_on - 1).abs().max()) if r_on.numel() else None,
             "clipped": int(took_clip.sum()), "truncated": int(truncated.sum()), "n": int(on.sum())}
    return terms, stats


def _accumulate(model, batches: MicroBatches, config: GrpoConfig) -> StepMetrics:
    """Forward and backward over every micro-batch, gradients summed into .grad (zeroed first)."""
    model.zero_grad(set_to_none=True)
    total = batches.counts["tokens_trainable"]
    m = StepMetrics(tokens_forward=batches.counts["tokens_forward"], tokens_trainable=total,
                    micro_batches=len(batches), notes=list(batches.notes),
                    left_out={k: v for k, v in batches.counts.items() if "left_out" in k or "unknown" in k})
    if total == 0:
        m.notes.append("no trainable tokens: nothing to step")
        return m
    ratio_sum, ratio_max = 0.0, -math.inf
    for i, mb in enumerate(batches):
        terms, st = token_terms(token_logprobs(model, **mb.model_inputs()), mb, config)
        loss = terms.sum() / total  # the step's Σ mask, not this micro-batch's
        if st["n"]:
            loss.backward()
        m.loss += float(loss.detach())
        ratio_sum += st["ratio_sum"]
        ratio_max = max(ratio_max, st["ratio_max"] if st["ratio_max"] is not None else -math.inf)
        if i == 0:
            m.first_ratio_max_dev = st["ratio_max_dev"]
        m.clip_share += st["clipped"] / total
        m.tis_share += st["truncated"] / total
    m.ratio_mean, m.ratio_max = ratio_sum / total, ratio_max
    return m


def policy_gradient(model, batches: MicroBatches,
                    config: GrpoConfig = GrpoConfig()) -> tuple[StepMetrics, torch.Tensor]:
    """The step's loss metrics and its gradient, flattened over the trainable parameters (in order), without an
    optimizer step; .grad is left holding it."""
    model.eval()  # no dropout: π_old came from a sampler without any
    started = time.perf_counter()
    m = _accumulate(model, batches, config)
    m.seconds = time.perf_counter() - started
    m.tokens_per_s = m.tokens_forward / m.seconds if m.seconds > 0 else None
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters() if p.requires_grad])
    return m, flat


def grpo_step(model, optimizer: torch.optim.Optimizer, batches: MicroBatches,
              config: GrpoConfig = GrpoConfig()) -> StepMetrics:
    """One optimizer step over `batches` (see the module docstring); returns its metrics."""
    model.eval()  # no dropout: π_old came from a sampler without any
    started = time.perf_counter()
    m = _accumulate(model, batches, config)
    if m.tokens_trainable:
        params = [p for p in model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm or math.inf)
        m.grad_norm = float(norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    m.seconds = time.perf_counter() - started
    m.tokens_per_s = m.tokens_forward / m.seconds if m.seconds > 0 else None
    return m
