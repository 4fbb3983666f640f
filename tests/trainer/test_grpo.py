"""polar.trainer.grpo (docs/architecture.md#the-trainer-side): the reference GRPO step on real rollouts of the tiny
model.

Scenarios:
1.1 on-policy: at the first micro-step every ratio is 1 within 1e-3 (fp32 serving, exact mode, T=1).
1.2 per_request and prefix_merging batches of the same rollouts: equal trainable tokens, equal loss, gradient
    cosine ≥ 0.9999 (token-sum normalisation; prefix_merging with --on-mismatch split, so a call whose context was
    re-rendered keeps the context it was sampled in, as in per_request).
1.3 one optimizer step changes the parameters; the metrics are filled.
1.4 calls not sampled at T=1 are left out and counted.
2.x token-sum normalisation and TIS against a hand computation on a tiny synthetic case; the clip share and
    kl_initial by staleness (k3 over the tokens the policy in memory sampled).
3.x the learning knobs (issue 41) against hand computations: clip-higher (ε_high) and the low/high clip shares; the
    entropy bonus (loss and gradient); TRL's adaptive entropy controller step by step and across grpo_update's
    optimizer steps; --normalize rollout (a long and a short session weigh the same).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from polar.trainer import grpo, loader
from polar.trainer.loader import MicroBatches, Selection, SequenceTokens
from polar.trainer.recompute import load_model, token_logprobs

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / ".cache" / "models" / "tiny"
POLAR_PROCESS = ROOT / ".venv" / "bin" / "polar-process"
BUDGET = 2048


def _process(run: Path, out: Path, rewards: Path, *args: str) -> Path:
    proc = subprocess.run([str(POLAR_PROCESS), str(run / "flows"), "-o", str(out), "--rewards", str(rewards),
                           "--tokenizer", str(TINY), "-q", *args], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "batches"


@pytest.fixture(scope="module")
def both_modes(exact_rollout, tmp_path_factory) -> dict[str, Path]:
    """exact_rollout's flows re-processed in both modes, every session rewarded 2^i in one group: the task's own
    rewards are often all equal (every advantage 0, every gradient 0), and 2^i is never the group's mean, so no
    session's advantage is 0."""
    base = tmp_path_factory.mktemp("modes")
    sessions = sorted(set(pl.read_parquet(exact_rollout / "out" / "calls.parquet")["session"].drop_nulls()))
    rewards = base / "rewards.jsonl"
    rewards.write_text("".join(json.dumps({"session": s, "reward": float(2 ** i), "group": "g"}) + "\n"
                               for i, s in enumerate(sessions)))
    return {"per_request": _process(exact_rollout, base / "per_request", rewards, "--mode", "per_request"),
            "prefix_merging": _process(exact_rollout, base / "prefix_merging", rewards, "--on-mismatch", "split")}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(a @ b / (a.norm() * b.norm()))


def test_1_1_the_first_micro_step_is_on_policy(both_modes):
    batches = loader.micro_batches(str(both_modes["prefix_merging"]), BUDGET, "per_sequence")
    assert batches.counts["tokens_trainable"] > 0, batches.notes
    metrics, _ = grpo.policy_gradient(load_model(str(TINY)), batches)
    assert metrics.first_ratio_max_dev < 1e-3
    assert abs(metrics.ratio_mean - 1) < 1e-4 and metrics.ratio_max < 1 + 1e-3
    assert metrics.clip_share == 0


@pytest.mark.parametrize("leave_out_constrained", [True, False])
def test_1_2_per_request_and_prefix_merging_give_the_same_gradient(both_modes, leave_out_constrained):
    got = {}
    for mode, batches_dir in both_modes.items():
        batches = loader.micro_batches(str(batches_dir), BUDGET, "per_sequence",
                                       leave_out_constrained=leave_out_constrained)
        got[mode] = (batches.counts, *grpo.policy_gradient(load_model(str(TINY)), batches))
    (c1, m1, g1), (c2, m2, g2) = got["per_request"], got["prefix_merging"]
    assert c1["tokens_trainable"] == c2["tokens_trainable"] > 0, (c1, c2)
    assert c1["rows"] >= c2["rows"]  # one row per call vs one per chain
    assert g1.abs().sum() > 0, (c1, c2)
    assert _cosine(g1, g2) >= 0.9999, (c1, c2, m1.loss, m2.loss)
    assert m1.loss == pytest.approx(m2.loss, abs=1e-5)


def test_1_3_one_step_changes_the_parameters(both_modes):
    model = load_model(str(TINY))
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    config = grpo.GrpoConfig(lr=1e-3)
    metrics = grpo.grpo_step(model, grpo.make_optimizer(model, config),
                             loader.micro_batches(str(both_modes["prefix_merging"]), BUDGET, "packed"), config)
    changed = [k for k, p in model.named_parameters() if not torch.equal(before[k], p.detach())]
    assert len(changed) == len(before)
    assert metrics.tokens_trainable > 0 and metrics.tokens_forward >= metrics.tokens_trainable
    assert metrics.grad_norm > 0 and metrics.tokens_per_s > 0 and metrics.seconds > 0
    assert set(metrics.as_dict()) >= {"loss", "ratio_mean", "ratio_max", "clip_share", "tis_share", "tokens_forward",
                                      "tokens_trainable", "tokens_per_s"}


def test_1_4_calls_not_sampled_at_t1_are_left_out_and_counted(both_modes, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(both_modes["per_request"].parent, out)
    calls = pl.read_parquet(out / "calls.parquet")
    seqs = pl.read_parquet(str(out / "batches" / "*.parquet")).filter(pl.col("n_trainable") > 0)
    hot = seqs["call_ids"][0][0]
    calls = calls.with_columns(pl.when(pl.col("call_id") == hot).then(0.7).otherwise(1.0).alias("temperature"))
    calls.write_parquet(out / "calls.parquet")
    batches = loader.micro_batches(str(out / "batches"), BUDGET, "per_sequence", leave_out_constrained=False)
    clean = loader.micro_batches(str(both_modes["per_request"]), BUDGET, "per_sequence", leave_out_constrained=False)
    assert batches.counts["sampling_calls_left_out"] == 1
    left = batches.counts["sampling_tokens_left_out"]
    assert left == int(seqs["n_trainable"][0]) > 0
    assert batches.counts["tokens_trainable"] == clean.counts["tokens_trainable"] - left
    metrics, _ = grpo.policy_gradient(load_model(str(TINY)), batches)
    assert metrics.left_out["sampling_calls_left_out"] == 1


# ---------------------------------------------------------------------------------------------------- by hand

def _synthetic(model, shifts=(-0.3, 0.0, 0.3)) -> list[SequenceTokens]:
    """Three sequences whose π_old is the model's own logprob moved by one of `shifts` (±0.3: ratios leave the clip
    range)."""
    rng = np.random.default_rng(7)
    seqs = []
    for k, (n, prompt, adv) in enumerate([(40, 10, 1.5), (25, 20, -0.5), (60, 5, 0.8)]):
        ids = rng.integers(1, 3072, n)
        with torch.no_grad():
            lp = token_logprobs(model, torch.from_numpy(ids)[None])[0].numpy()
        mask = (np.arange(n) >= prompt).astype(np.float32)
        old = (lp + rng.choice(list(shifts), n)).astype(np.float32) * mask
        seqs.append(SequenceTokens(f"s{k}", ids, mask, old, adv))
    return seqs


@pytest.mark.parametrize("tis_cap", [None, 1.1])
def test_2_1_token_sum_normalisation_matches_a_hand_computation(tis_cap):
    model = load_model(str(TINY))
    seqs = _synthetic(model)
    batches = MicroBatches(Selection(seqs, {}, []), 64, "per_sequence")  # budget 64: three micro-batches
    assert len(batches) == 3
    config = grpo.GrpoConfig(clip=0.2, tis_cap=tis_cap)
    metrics, grad = grpo.policy_gradient(model, batches, config)

    model.zero_grad(set_to_none=True)
    terms, per_batch, count, truncated = [], [], 0.0, 0
    for s in seqs:  # each sequence alone, the formula written out
        lp = token_logprobs(model, torch.from_numpy(s.input_ids)[None])[0]
        mask, old = torch.from_numpy(s.loss_mask), torch.from_numpy(s.logprobs)
        mask[0] = 0
        r = torch.exp(lp - old)
        t = -torch.minimum(r * s.advantage, torch.clamp(r, 0.8, 1.2) * s.advantage)
        if tis_cap is not None:
            w = torch.where(r.detach() > tis_cap, tis_cap / r.detach(), torch.ones_like(r))
            truncated += int(((r.detach() > tis_cap) & (mask > 0)).sum())
            t = t * w
        terms.append((t * mask).sum())
        per_batch.append(float((t * mask).sum().detach() / mask.sum()))
        count += float(mask.sum())
    hand = torch.stack(terms).sum() / count
    hand.backward()
    hand_grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])

    assert metrics.loss == pytest.approx(float(hand.detach()), abs=1e-6)
    assert metrics.tokens_trainable == count
    assert torch.allclose(grad, hand_grad, atol=1e-6, rtol=1e-4)
    assert metrics.loss != pytest.approx(float(np.mean(per_batch)), abs=1e-3)  # not a mean of micro-batch means
    assert 0 < metrics.clip_share < 1
    assert metrics.tis_share == pytest.approx(truncated / count) and (tis_cap is None) == (truncated == 0)


def test_2_2_clip_share_by_staleness_splits_the_clip_share():
    """The clip share of each staleness is that staleness's tokens' share, and the shares weighted by their tokens
    give the step's clip share back (two updates: from the second on, the policy has moved)."""
    model = load_model(str(TINY))
    model.requires_grad_(True)
    seqs = _synthetic(model)
    for s, stale in zip(seqs, (0, 1, 1)):
        s.staleness = stale
    batches = MicroBatches(Selection(seqs, {}, []), 64, "per_sequence")
    config = grpo.GrpoConfig(lr=1e-2, clip=0.2)
    m = grpo.grpo_update(model, grpo.make_optimizer(model, config), batches, config, mini_batches=1, epochs=2)
    tokens = {"0": 2 * float(seqs[0].loss_mask[1:].sum()),
              "1": 2 * float(seqs[1].loss_mask[1:].sum() + seqs[2].loss_mask[1:].sum())}
    assert {k: n for k, (_, n) in m.clip_by_staleness.items()} == tokens
    shares = m.clip_share_by_staleness
    assert set(shares) == {"0", "1"} and all(0 <= v <= 1 for v in shares.values())
    weighted = sum(shares[k] * tokens[k] for k in tokens) / sum(tokens.values())
    assert weighted == pytest.approx(m.clip_share, abs=1e-9)
    assert m.as_dict()["clip_share_by_staleness"] == shares


def test_2_3_kl_initial_is_measured_on_the_tokens_the_policy_in_memory_sampled():
    """k3 KL(π‖π_ref) holds only over tokens drawn from π: a stale sequence's tokens are left out of it (entropy keeps
    every trainable token); with only stale tokens there is no estimate. The update's own first-forward figure is the
    same measurement."""
    model = load_model(str(TINY))
    reference = load_model(str(TINY))
    with torch.no_grad():  # a reference the policy has moved away from
        for p in reference.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    seqs = _synthetic(model)

    def measured(stale: tuple[int, ...], which=(0, 1, 2)):
        chosen = [seqs[i] for i in which]
        for s, st in zip(chosen, stale):
            s.staleness = st
        return grpo._measure(model, MicroBatches(Selection(chosen, {}, []), 64, "per_sequence"), reference)

    ent_all, kl_all = measured((0, 0, 0))
    ent_mixed, kl_mixed = measured((0, 1, 2))
    _, kl_first = measured((0,), which=(0,))
    assert kl_all > 0 and kl_mixed == pytest.approx(kl_first, rel=1e-6) and kl_mixed != pytest.approx(kl_all)
    assert ent_mixed == pytest.approx(ent_all, rel=1e-6)  # entropy still over every trainable token
    assert measured((1, 1, 2))[1] is None
    for s, st in zip(seqs, (0, 1, 2)):
        s.staleness = st
    batches = MicroBatches(Selection(seqs, {}, []), 64, "per_sequence")
    model.requires_grad_(True)
    config = grpo.GrpoConfig(lr=1e-2, clip=0.2)
    m = grpo.grpo_update(model, grpo.make_optimizer(model, config), batches, config, reference=reference)
    assert m.kl_initial == pytest.approx(kl_first, rel=1e-4)


# -- 3.x the learning knobs (issue 41) ---------------------------------------------------------------------------------

def _by_hand(model, seqs, low: float, high: float, entropy_coef: float = 0.0, per_session: bool = False):
    """The loss written out per sequence: −Σ m·min(r·A, clip(r, 1−low, 1+high)·A) / Σ m (per_session: each session's
    token mean, averaged over the sessions) − c·Σ m·H / Σ m; its gradient; the low and high clip counts; Σ m."""
    model.zero_grad(set_to_none=True)
    count = sum(float(s.loss_mask[1:].sum()) for s in seqs)
    by_session: dict[str, list] = {}
    policy, bonus, n_low, n_high = [], [], 0, 0
    for s in seqs:
        out = torch.log_softmax(model(input_ids=torch.from_numpy(s.input_ids)[None]).logits[0, :-1].float(), -1)
        lp = torch.nn.functional.pad(out.gather(-1, torch.from_numpy(s.input_ids)[1:, None]).squeeze(-1), (1, 0))
        ent = torch.nn.functional.pad(-(out.exp() * out).sum(-1), (1, 0))
        mask, old = torch.from_numpy(s.loss_mask).clone(), torch.from_numpy(s.logprobs)
        mask[0] = 0
        r = torch.exp(lp - old)
        t = -torch.minimum(r * s.advantage, torch.clamp(r, 1 - low, 1 + high) * s.advantage) * mask
        n_low += int(((r < 1 - low) & (mask > 0)).sum()) if s.advantage < 0 else 0
        n_high += int(((r > 1 + high) & (mask > 0)).sum()) if s.advantage > 0 else 0
        by_session.setdefault(s.session or s.sequence_id, []).append((t.sum(), float(mask.sum())))
        policy.append(t.sum())
        bonus.append((ent * mask).sum())
    if per_session:
        loss = torch.stack([sum(t for t, _ in v) / sum(n for _, n in v) for v in by_session.values()]).mean()
    else:
        loss = torch.stack(policy).sum() / count
    loss = loss - entropy_coef * torch.stack(bonus).sum() / count
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])
    return float(loss.detach()), grad, n_low, n_high, count


def test_3_1_clip_high_clips_each_side_at_its_own_epsilon():
    """ε_low 0.2, ε_high 0.28, on ratios of e^±0.3 (outside both) and e^0.22 = 1.246 (inside [0.8, 1.28], outside
    [0.8, 1.2]): loss, gradient and the low/high clip shares as written out; the symmetric clip gives another loss."""
    model = load_model(str(TINY))
    seqs = _synthetic(model, shifts=(-0.3, -0.22, 0.0, 0.3))
    batches = MicroBatches(Selection(seqs, {}, []), 64, "per_sequence")
    m, grad = grpo.policy_gradient(model, batches, grpo.GrpoConfig(clip=0.2, clip_high=0.28))
    loss, hand_grad, n_low, n_high, count = _by_hand(model, seqs, 0.2, 0.28)
    assert m.loss == pytest.approx(loss, abs=1e-6)
    assert torch.allclose(grad, hand_grad, atol=1e-6, rtol=1e-4)
    assert n_low > 0 and n_high > 0
    assert m.clip_share_low == pytest.approx(n_low / count) and m.clip_share_high == pytest.approx(n_high / count)
    assert m.clip_share == pytest.approx(m.clip_share_low + m.clip_share_high)
    symmetric, _ = grpo.policy_gradient(model, batches, grpo.GrpoConfig(clip=0.2))
    assert symmetric.clip_share_high > m.clip_share_high and symmetric.loss != pytest.approx(m.loss, abs=1e-6)
    assert symmetric.clip_share_low == pytest.approx(m.clip_share_low)


def test_3_2_the_entropy_bonus_is_minus_c_times_the_token_mean_entropy():
    model = load_model(str(TINY))
    seqs = _synthetic(model)
    batches = MicroBatches(Selection(seqs, {}, []), 64, "per_sequence")
    m, grad = grpo.policy_gradient(model, batches, grpo.GrpoConfig(clip=0.2, entropy_coef=0.1))
    loss, hand_grad, *_ = _by_hand(model, seqs, 0.2, 0.2, entropy_coef=0.1)
    plain, _ = grpo.policy_gradient(model, batches, grpo.GrpoConfig(clip=0.2))
    assert m.loss == pytest.approx(loss, abs=1e-5)
    assert torch.allclose(grad, hand_grad, atol=1e-6, rtol=1e-4)
    assert plain.loss - m.loss == pytest.approx(0.1 * m.entropy, rel=1e-4) and m.entropy > 1


def test_3_3_the_adaptive_controller_steps_as_trl_1_16s():
    """TRL 1.16 (GRPOConfig entropy_coef_delta 0.005, bounds [0, 1]): no bonus before the first measurement; after
    each optimizer step ±δ (up at or below the target), clamped; applied only while the last entropy ≤ the target."""
    c = grpo.EntropyControl(coef=0.0, target=0.5)
    assert c.enabled and c.applied() == 0.0  # nothing measured yet
    c.observe(0.5)  # at the target: up
    assert (c.coef, c.applied()) == (pytest.approx(0.005), pytest.approx(0.005))
    c.observe(0.7)  # above: down, and not applied
    assert (c.coef, c.applied()) == (pytest.approx(0.0), 0.0)
    c.observe(0.9)  # the floor
    assert c.coef == 0.0
    top = grpo.EntropyControl(coef=0.998, target=0.5)
    top.observe(0.1)
    assert top.coef == 1.0  # the ceiling
    fixed = grpo.EntropyControl(coef=0.03)
    fixed.observe(0.0)
    assert (fixed.coef, fixed.applied()) == (0.03, 0.03) and not grpo.EntropyControl().enabled


@pytest.mark.parametrize("target, start, after", [(100.0, 0.0, 0.015), (0.01, 0.1, 0.085)])
def test_3_4_grpo_update_steps_the_controller_once_per_optimizer_step(target, start, after):
    """Three optimizer steps (epochs 3): the coefficient moves 3 δ, up when the entropy (> 1 nat here) is below the
    target, down when above."""
    model = load_model(str(TINY))
    model.requires_grad_(True)
    seqs = _synthetic(model)
    batches = MicroBatches(Selection(seqs, {}, []), 64, "per_sequence")
    config = grpo.GrpoConfig(lr=1e-3, clip=0.2, entropy_coef=start, entropy_target=target)
    control = grpo.EntropyControl.of(config)
    m = grpo.grpo_update(model, grpo.make_optimizer(model, config), batches, config, epochs=3, entropy=control)
    assert m.updates == 3 and m.entropy > 1
    assert m.entropy_coef == pytest.approx(after) and control.coef == pytest.approx(after)
    assert control.last_entropy < m.entropy + 1 and control.last_entropy != float("inf")
    assert m.as_dict()["entropy_coef"] == pytest.approx(after)
    plain = load_model(str(TINY)).requires_grad_(True)
    none = grpo.grpo_update(plain, grpo.make_optimizer(plain, config), batches, grpo.GrpoConfig(clip=0.2))
    assert none.entropy_coef is None  # no bonus: nothing to report


def test_3_5_normalize_rollout_weighs_a_long_and_a_short_session_the_same():
    """Session a: two sequences (30 + 55 trainable tokens), session b: one of 5: under rollout each session's tokens
    weigh 1/2 in total (token: 85/90 and 5/90); the loss and gradient are the mean of the sessions' token means."""
    model = load_model(str(TINY))
    seqs = _synthetic(model)
    for s, sess in zip(seqs, ("a", "b", "a")):
        s.session = sess
    batches = MicroBatches(Selection(seqs, {}, []), 64, "per_sequence")
    per_session = grpo.session_weights(batches)
    totals = {}
    for mb in batches:
        w = grpo.token_weights(mb, batches.counts["tokens_trainable"], per_session)
        for sess, (b, a, e) in zip(mb.sessions, mb.segments):
            totals[sess] = totals.get(sess, 0.0) + float((w[b, a:e] * mb.loss_mask[b, a:e]).sum())
    assert totals == {"a": pytest.approx(0.5), "b": pytest.approx(0.5)}
    config = grpo.GrpoConfig(clip=0.2, normalize="rollout")
    m, grad = grpo.policy_gradient(model, batches, config)
    loss, hand_grad, *_ = _by_hand(model, seqs, 0.2, 0.2, per_session=True)
    assert m.loss == pytest.approx(loss, abs=1e-6)
    assert torch.allclose(grad, hand_grad, atol=1e-6, rtol=1e-4)
    token, _ = grpo.policy_gradient(model, batches, grpo.GrpoConfig(clip=0.2))
    assert token.loss != pytest.approx(m.loss, abs=1e-4)
