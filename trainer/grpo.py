"""The reference GRPO step (docs/architecture.md#the-trainer-side): one optimizer step over all micro-batches of a
rollout batch.

loss = −Σ_t m_t · w_t · min(r_t·A_t, clip(r_t, 1−ε_low, 1+ε_high)·A_t) / Σ_t m_t  −  c · Σ_t m_t·H_t / Σ_t m_t
- the sums run over every trainable token of the whole step (token-sum normalisation, DAPO-style): each token
  weighs the same wherever it sits, so per_request and prefix_merging batches of the same rollouts give the same
  loss and gradient when the merge is exact; `normalize="rollout"` instead weighs each session (rollout) as one,
  however many tokens it has: token t of session s is divided by n_s · S (n_s: s's trainable tokens in the step,
  S: the step's sessions) instead of Σ m (Agent Lightning's per-rollout mean); a row without a session is its own;
- ε_low = `clip`, ε_high = `clip_high` (clip-higher, DAPO: a rare token's probability may rise further than a
  common one's may fall; None = ε_low);
- H_t = the policy's entropy at t, with gradient; c = the entropy coefficient, TRL 1.16's semantics
  (`entropy_coef`, `use_adaptive_entropy`, after Skywork-OR1): fixed at `entropy_coef` when `entropy_target` is
  None; otherwise `EntropyControl` — the bonus applies only while the entropy measured at the previous optimizer
  step is at or below the target (none before the first measurement), and after each optimizer step the
  coefficient moves by ENTROPY_COEF_DELTA (up when that step's entropy is at or below the target, else down) within
  [ENTROPY_COEF_MIN, ENTROPY_COEF_MAX]. The entropy term is a token mean under either normalisation (as TRL's);
- r_t = exp(log πθ(t) − log π_old(t)), π_old = the recorded (sampler's) logprobs (bypass: no old-policy forward);
- w_t = 1, or with truncated importance sampling (cap C) w_t = min(r_t, C) / r_t, detached: the token's importance
  weight is truncated at C (the gradient of r·A is r·∇log π·A; the weight makes it min(r, C)·∇log π·A);
- m_t = the loader's loss mask: token 0 never, calls not sampled at T=1/top_p=1/top_k=-1 under raw_logprobs never
  (left out and counted by the loader), rows without advantage or logprobs not at all.
Gradients accumulate over the micro-batches (each backward divides by the step's Σ m, known before the first), then
AdamW steps once. `policy_gradient` is the same without the optimizer step (for the per_request/prefix_merging
equality check).

`grpo_update` is the PPO-style form polar-train uses: the rollout batch's sequences are shuffled (seeded) and cut into
`mini_batches` parts, and each part is one optimizer step (the loss above over that part's tokens), `epochs` times
over: M·E updates per rollout batch. π_old stays the recorded logprobs throughout, so from the second update on the
ratio moves away from 1 and the clip starts to matter. M = E = 1 is `grpo_step`. It also reports, from the forward
passes it does anyway, the mean token entropy of the policy on trainable tokens and — given a frozen `reference`
model (the initial policy) — the k3 estimate of KL(π‖π_ref), both measured at the first update's forward, i.e. on
the policy that sampled the batch.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field

import torch
from polar.trainer.loader import MicroBatch, MicroBatches, Selection
from polar.trainer.recompute import token_logprobs


@dataclass(frozen=True)
class GrpoConfig:
    lr: float = 1e-3
    clip: float = 0.2  # ε
    tis_cap: float | None = None  # C; None = off
    weight_decay: float = 0.0
    max_grad_norm: float | None = None  # None = no clipping of the gradient norm
    clip_high: float | None = None  # ε_high; None = clip (symmetric)
    entropy_coef: float = 0.0  # the entropy bonus's coefficient (with entropy_target: its starting value)
    entropy_target: float | None = None  # nats; None = a fixed coefficient, else the adaptive controller
    normalize: str = "token"  # "token": each trainable token weighs the same; "rollout": each session

    @property
    def eps_high(self) -> float:
        return self.clip if self.clip_high is None else self.clip_high

# TRL 1.16's GRPOConfig defaults for the adaptive controller (entropy_coef_delta, entropy_coef_min,
# entropy_coef_max); its entropy_target defaults to 0.2 and entropy_coef to 0.0
ENTROPY_COEF_DELTA, ENTROPY_COEF_MIN, ENTROPY_COEF_MAX = 0.005, 0.0, 1.0


@dataclass
class EntropyControl:
    """The entropy bonus's coefficient across optimizer steps (TRL 1.16's controller, see the module docstring).
    `last_entropy`: the mean token entropy the last optimizer step measured (inf before the first)."""

    coef: float = 0.0
    target: float | None = None
    last_entropy: float = math.inf

    @classmethod
    def of(cls, config: GrpoConfig) -> "EntropyControl":
        return cls(coef=config.entropy_coef, target=config.entropy_target)

    @property
    def enabled(self) -> bool:
        return self.coef != 0.0 or self.target is not None

    def applied(self) -> float:
        """The coefficient this optimizer step's loss uses."""
        if self.target is None:
            return self.coef
        return self.coef if self.last_entropy <= self.target else 0.0

    def observe(self, entropy: float) -> None:
        """After an optimizer step whose tokens had mean entropy `entropy`: the coefficient for the next."""
        if self.target is None:
            return
        if entropy <= self.target:
            self.coef = min(self.coef + ENTROPY_COEF_DELTA, ENTROPY_COEF_MAX)
        else:
            self.coef = max(self.coef - ENTROPY_COEF_DELTA, ENTROPY_COEF_MIN)
        self.last_entropy = entropy


@dataclass
class StepMetrics:
    loss: float = 0.0
    ratio_mean: float | None = None
    ratio_max: float | None = None
    first_ratio_max_dev: float | None = None  # max |r − 1| over the first micro-batch (on-policy: ≈ 0)
    clip_share: float = 0.0  # tokens whose clipped term was taken (no gradient through r)
    clip_share_low: float = 0.0  # of those, r < 1 − ε_low with A < 0
    clip_share_high: float = 0.0  # of those, r > 1 + ε_high with A > 0
    entropy_coef: float | None = None  # the entropy coefficient after the step (the controller's; None: no bonus)
    tis_share: float = 0.0  # tokens whose importance weight was truncated at the cap
    tokens_forward: int = 0
    tokens_trainable: int = 0
    micro_batches: int = 0
    seconds: float = 0.0
    tokens_per_s: float | None = None
    grad_norm: float | None = None
    updates: int = 0  # optimizer steps taken
    sequences: int = 0
    response_len: float | None = None  # trainable tokens per sequence
    entropy: float | None = None  # mean token entropy (nats) of the policy on trainable tokens, first forward
    kl_initial: float | None = None  # k3 estimate of KL(π‖π_ref) on trainable tokens π sampled, first forward
    left_out: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    # {staleness: [tokens whose clipped term was taken, trainable tokens]} over every update ("-1": not known)
    clip_by_staleness: dict = field(default_factory=dict)

    @property
    def clip_share_by_staleness(self) -> dict[str, float]:
        return {k: c / n for k, (c, n) in sorted(self.clip_by_staleness.items(), key=lambda kv: int(kv[0])) if n}

    def as_dict(self) -> dict:
        return {**asdict(self), "clip_share_by_staleness": self.clip_share_by_staleness}


def make_optimizer(model, config: GrpoConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                             weight_decay=config.weight_decay)


def token_terms(logprobs: torch.Tensor, mb: MicroBatch, config: GrpoConfig) -> tuple[torch.Tensor, dict]:
    """Per-token loss terms −w·min(r·A, clip(r)·A) (0 off the mask) and the micro-batch's ratio statistics."""
    mask = mb.loss_mask
    on = mask > 0
    ratio = torch.exp(torch.where(on, logprobs - mb.old_logprobs, torch.zeros_like(logprobs)))
    adv = mb.advantages
    clipped = torch.clamp(ratio, 1 - config.clip, 1 + config.eps_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    # the clipped term is taken (no gradient through r) when r < 1 − ε_low with A < 0, or r > 1 + ε_high with A > 0
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
             "clipped": int(took_clip.sum()), "clipped_low": int((took_clip & (adv < 0)).sum()),
             "clipped_high": int((took_clip & (adv > 0)).sum()), "truncated": int(truncated.sum()), "n": int(on.sum()),
             "by_staleness": _by_staleness(mb, on, took_clip)}
    return terms, stats


def _by_staleness(mb: MicroBatch, on: torch.Tensor, took_clip: torch.Tensor) -> dict[str, list[int]]:
    """{staleness: [clipped, trainable]} of the micro-batch's trainable tokens."""
    if mb.staleness is None:
        return {}
    st, clipped = mb.staleness[on], took_clip[on]
    return {str(v): [int((clipped & (st == v)).sum()), int((st == v).sum())] for v in torch.unique(st).tolist()}


def _add_counts(into: dict, counts: dict) -> None:
    for k, (c, n) in counts.items():
        have = into.setdefault(k, [0, 0])
        have[0] += c
        have[1] += n


def logprobs_and_entropy(model, mb: MicroBatch, grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """recompute.token_logprobs (the same arithmetic, so the on-policy ratio stays exactly 1) and each position's
    entropy of the next-token distribution (position t: the distribution token t was drawn from), with gradient
    only when `grad` (the entropy bonus)."""
    out = model(**mb.model_inputs(), use_cache=False)
    logits = out.logits[:, :-1].float()
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1) - lse
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    pad = torch.nn.functional.pad
    return pad(picked, (1, 0)), pad(ent, (1, 0))


def session_weights(batches: MicroBatches) -> dict[str, float]:
    """normalize="rollout": each session's per-token weight 1 / (n_s · S) over the step's trainable tokens."""
    n: dict[str, float] = {}
    for g in batches.groups:
        for s in g:
            k = _session_key(s.session, s.sequence_id)
            n[k] = n.get(k, 0.0) + float(s.loss_mask[1:].sum())
    n = {k: v for k, v in n.items() if v > 0}
    return {k: 1.0 / (v * len(n)) for k, v in n.items()}


def _session_key(session: str | None, sequence_id: str) -> str:
    return f"session:{session}" if session is not None else f"sequence:{sequence_id}"


def token_weights(mb: MicroBatch, total: int, per_session: dict[str, float] | None) -> torch.Tensor | float:
    """Each token's weight in the loss: 1 / Σ m (token), or its session's 1 / (n_s · S) (rollout)."""
    if per_session is None:
        return 1.0 / total
    w = torch.zeros_like(mb.loss_mask)
    for sid, sess, (b, a, e) in zip(mb.sequence_ids, mb.sessions, mb.segments):
        w[b, a:e] = per_session.get(_session_key(sess, sid), 0.0)
    return w


def micro_batch_loss(logprobs: torch.Tensor, entropy: torch.Tensor | None, mb: MicroBatch, config: GrpoConfig,
                     total: int, entropy_coef: float = 0.0,
                     per_session: dict[str, float] | None = None) -> tuple[torch.Tensor, dict]:
    """The micro-batch's share of the step's loss (the module docstring's formula; `total` = the step's Σ m) and
    token_terms' statistics."""
    terms, st = token_terms(logprobs, mb, config)
    weights = token_weights(mb, total, per_session)
    loss = terms.sum() * weights if isinstance(weights, float) else (terms * weights).sum()
    if entropy_coef:
        loss = loss - entropy_coef * (entropy * mb.loss_mask).sum() / total
    return loss, st


def _accumulate(model, batches: MicroBatches, config: GrpoConfig, *, measure: bool = False,
                reference=None, entropy_coef: float = 0.0, track_entropy: bool = False) -> StepMetrics:
    """Forward and backward over every micro-batch, gradients summed into .grad (zeroed first). `measure`: also the
    policy's mean token entropy and, with `reference`, the k3 KL to it (trainable tokens); `track_entropy`: the
    entropy (for the controller) without the KL; `entropy_coef`: the bonus's coefficient in this loss."""
    model.zero_grad(set_to_none=True)
    total = batches.counts["tokens_trainable"]
    m = StepMetrics(tokens_forward=batches.counts["tokens_forward"], tokens_trainable=total,
                    micro_batches=len(batches), notes=list(batches.notes),
                    left_out={k: v for k, v in batches.counts.items() if "left_out" in k or "unknown" in k})
    if total == 0:
        m.notes.append("no trainable tokens: nothing to step")
        return m
    ratio_sum, ratio_max = 0.0, -math.inf
    ent_sum, kl_sum, kl_n = 0.0, 0.0, 0
    per_session = session_weights(batches) if config.normalize == "rollout" else None
    with_entropy = measure or track_entropy or entropy_coef != 0
    for i, mb in enumerate(batches):
        ent = None
        if with_entropy:
            logprobs, ent = logprobs_and_entropy(model, mb, grad=entropy_coef != 0)
            on = mb.loss_mask > 0
            ent_sum += float(ent.detach()[on].sum())
            if measure and reference is not None:
                with torch.no_grad():
                    ref = token_logprobs(reference, **mb.model_inputs())
                    k3, n = _k3_sum(ref, logprobs.detach(), _drawn_from_policy(mb, on))
                    kl_sum, kl_n = kl_sum + k3, kl_n + n
        else:
            logprobs = token_logprobs(model, **mb.model_inputs())
        # the step's Σ mask (or its sessions), not this micro-batch's
        loss, st = micro_batch_loss(logprobs, ent, mb, config, total, entropy_coef, per_session)
        if st["n"]:
            loss.backward()
        m.loss += float(loss.detach())
        ratio_sum += st["ratio_sum"]
        ratio_max = max(ratio_max, st["ratio_max"] if st["ratio_max"] is not None else -math.inf)
        if i == 0:
            m.first_ratio_max_dev = st["ratio_max_dev"]
        m.clip_share += st["clipped"] / total
        m.clip_share_low += st["clipped_low"] / total
        m.clip_share_high += st["clipped_high"] / total
        m.tis_share += st["truncated"] / total
        _add_counts(m.clip_by_staleness, st["by_staleness"])
    m.ratio_mean, m.ratio_max = ratio_sum / total, ratio_max
    if with_entropy:
        m.entropy = ent_sum / total
        m.kl_initial = kl_sum / kl_n if reference is not None and kl_n else None
    return m


def policy_gradient(model, batches: MicroBatches,
                    config: GrpoConfig = GrpoConfig()) -> tuple[StepMetrics, torch.Tensor]:
    """The step's loss metrics and its gradient, flattened over the trainable parameters (in order), without an
    optimizer step; .grad is left holding it."""
    model.eval()  # no dropout: π_old came from a sampler without any
    started = time.perf_counter()
    m = _accumulate(model, batches, config, entropy_coef=EntropyControl.of(config).applied())
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
    m = _accumulate(model, batches, config, entropy_coef=EntropyControl.of(config).applied())
    if m.tokens_trainable:
        params = [p for p in model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm or math.inf)
        m.grad_norm = float(norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    m.seconds = time.perf_counter() - started
    m.tokens_per_s = m.tokens_forward / m.seconds if m.seconds > 0 else None
    return m


@torch.no_grad()
def _drawn_from_policy(mb: MicroBatch, on: torch.Tensor) -> torch.Tensor:
    """The tokens of `on` that the policy in memory sampled (staleness 0, or not known). k3 = e^d − d − 1 with
    d = log π_ref − log π estimates KL(π‖π_ref) only over tokens drawn from π; a stale token was drawn from an
    older policy, where the estimate is biased without bound (it read 10^3–10^6 nats under --max-staleness 1)."""
    return on if mb.staleness is None else on & (mb.staleness <= 0)


@torch.no_grad()
def _k3_sum(ref: torch.Tensor, logprobs: torch.Tensor, drawn: torch.Tensor) -> tuple[float, int]:
    """(Σ k3, tokens) over `drawn`: k3 = e^d − d − 1, d = log π_ref − log π."""
    d = (ref - logprobs)[drawn]
    return float((torch.exp(d) - d - 1).sum()), int(drawn.sum())


@torch.no_grad()
def _measure(model, batches: MicroBatches, reference=None) -> tuple[float | None, float | None]:
    """(mean token entropy over the trainable tokens of `batches`, k3 KL to `reference` over those the policy in
    memory sampled — None without a reference or such a token), no gradient."""
    total, ent_sum, kl_sum, kl_n = batches.counts["tokens_trainable"], 0.0, 0.0, 0
    if not total:
        return None, None
    for mb in batches:
        logprobs, ent = logprobs_and_entropy(model, mb)
        on = mb.loss_mask > 0
        ent_sum += float(ent[on].sum())
        if reference is not None:
            k3, n = _k3_sum(token_logprobs(reference, **mb.model_inputs()), logprobs, _drawn_from_policy(mb, on))
            kl_sum, kl_n = kl_sum + k3, kl_n + n
    return ent_sum / total, (kl_sum / kl_n if reference is not None and kl_n else None)


def split(batches: MicroBatches, parts: int, rng: random.Random) -> list[MicroBatches]:
    """The batch's sequences shuffled by `rng` and cut into `parts` (≤ the number of sequences) mini-batches, each
    re-grouped into micro-batches the way `batches` was."""
    seqs = [s for g in batches.groups for s in g]
    rng.shuffle(seqs)
    parts = max(1, min(parts, len(seqs)))
    cuts = [round(i * len(seqs) / parts) for i in range(parts + 1)]
    counts = {k: v for k, v in batches.counts.items() if "left_out" in k or "unknown" in k}
    return [MicroBatches(Selection(seqs[a:b], dict(counts), []), batches.max_tokens, batches.layout)
            for a, b in zip(cuts, cuts[1:])]


def grpo_update(model, optimizer: torch.optim.Optimizer, batches: MicroBatches, config: GrpoConfig = GrpoConfig(),
                *, mini_batches: int = 1, epochs: int = 1, seed: int = 0, reference=None,
                entropy: EntropyControl | None = None) -> StepMetrics:
    """`epochs` passes over the batch, each cut into `mini_batches` shuffled parts, one optimizer step per part (see
    the module docstring). Metrics: loss, ratios and shares are token-weighted over every update; first_ratio_max_dev
    is the first update's first micro-batch (on-policy: ≈ 0); entropy and kl_initial are from the first update's
    forward; grad_norm is the mean over updates. `entropy`: the controller carried from step to step (None: a
    fresh one from `config`); it steps after every optimizer step, and entropy_coef reports it after the last."""
    control = entropy if entropy is not None else EntropyControl.of(config)
    model.eval()  # no dropout: π_old came from a sampler without any
    started = time.perf_counter()
    total = batches.counts["tokens_trainable"]
    n_seqs = sum(len(g) for g in batches.groups)
    m = StepMetrics(tokens_forward=batches.counts["tokens_forward"], tokens_trainable=total,
                    micro_batches=len(batches), notes=list(batches.notes), sequences=n_seqs,
                    response_len=total / n_seqs if n_seqs else None,
                    left_out={k: v for k, v in batches.counts.items() if "left_out" in k or "unknown" in k})
    if total == 0:
        m.notes.append("no trainable tokens: nothing to step")
        return m
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    seen, ratio_sum, norms, loss_sum = 0, 0.0, [], 0.0
    m.ratio_max = -math.inf
    for epoch in range(epochs):
        parts = [batches] if mini_batches == 1 else split(batches, mini_batches, rng)
        for part in parts:
            n = part.counts["tokens_trainable"]
            if n == 0:
                continue
            first = m.updates == 0
            if first and mini_batches > 1:  # entropy and KL over the whole batch, before any update
                m.entropy, m.kl_initial = _measure(model, batches, reference)
            um = _accumulate(model, part, config, measure=first and mini_batches == 1, reference=reference,
                             entropy_coef=control.applied() if control.enabled else 0.0,
                             track_entropy=control.target is not None)
            if first:
                m.first_ratio_max_dev = um.first_ratio_max_dev
                if mini_batches == 1:
                    m.entropy, m.kl_initial = um.entropy, um.kl_initial
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm or math.inf)))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if control.target is not None and um.entropy is not None:
                control.observe(um.entropy)
            m.updates += 1
            seen += n
            loss_sum += um.loss * n
            ratio_sum += um.ratio_mean * n
            m.ratio_max = max(m.ratio_max, um.ratio_max if um.ratio_max is not None else -math.inf)
            m.clip_share += um.clip_share * n
            m.clip_share_low += um.clip_share_low * n
            m.clip_share_high += um.clip_share_high * n
            m.tis_share += um.tis_share * n
            _add_counts(m.clip_by_staleness, um.clip_by_staleness)
    m.loss, m.ratio_mean = loss_sum / seen, ratio_sum / seen
    m.clip_share, m.tis_share = m.clip_share / seen, m.tis_share / seen
    m.clip_share_low, m.clip_share_high = m.clip_share_low / seen, m.clip_share_high / seen
    m.entropy_coef = control.coef if control.enabled else None
    m.grad_norm = sum(norms) / len(norms)
    m.seconds = time.perf_counter() - started
    m.tokens_per_s = m.tokens_forward * m.updates / mini_batches / m.seconds if m.seconds > 0 else None
    return m
