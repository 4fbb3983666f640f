"""polar-train's parts that need no server (issue 23): the PPO-style update (`grpo.grpo_update`: M mini-batches × E
epochs, π_old the recorded logprobs, so the clip starts to matter from the second update), the entropy and KL-to-
initial measurements, reward spread and groups without spread from results.jsonl, the learning rate picked from the
model, the seeded task draw, checkpoint pruning and the generated task families."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from polar.trainer import grpo
from polar.trainer import train as polar_train
from polar.trainer.loader import MicroBatches, Selection, SequenceTokens
from polar.trainer.plan import Plan, count_params, default_lr, task_dirs, tasks_of_step
from polar.trainer.recompute import load_model, token_logprobs
from polar.trainer.rollout_stage import rewards_of

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / ".cache" / "models" / "tiny"
FAMILIES = ROOT / "examples" / "tasks" / "families"


def _on_policy(model, n_seqs: int = 6) -> list[SequenceTokens]:
    """Sequences whose π_old is the model's own logprob (an on-policy batch), advantages of both signs."""
    rng = np.random.default_rng(3)
    seqs = []
    for k in range(n_seqs):
        n = int(rng.integers(20, 50))
        ids = rng.integers(1, 3072, n)
        with torch.no_grad():
            lp = token_logprobs(model, torch.from_numpy(ids)[None])[0].numpy()
        mask = (np.arange(n) >= 8).astype(np.float32)
        seqs.append(SequenceTokens(f"s{k}", ids, mask, (lp * mask).astype(np.float32), (-1.0) ** k * (1 + k / 4)))
    return seqs


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def test_update_counts_and_on_policy_first_ratio():
    model = load_model(str(TINY))
    model.requires_grad_(True)
    reference = copy.deepcopy(model).requires_grad_(False)
    batches = MicroBatches(Selection(_on_policy(model), {}, []), 128, "per_sequence")
    config = grpo.GrpoConfig(lr=1e-2, clip=0.2)
    before = _params(model)
    m = grpo.grpo_update(model, grpo.make_optimizer(model, config), batches, config, mini_batches=3, epochs=2,
                         seed=1, reference=reference)
    assert m.updates == 6 and m.sequences == 6
    assert m.first_ratio_max_dev < 1e-5  # the first update is on-policy
    assert m.kl_initial == pytest.approx(0.0, abs=1e-9)  # measured before any update: the policy is the initial one
    assert m.entropy is not None and 0 < m.entropy <= float(np.log(3072)) + 1e-4
    assert m.response_len == pytest.approx(m.tokens_trainable / 6)
    assert m.ratio_max > 1.0 and m.clip_share > 0  # later updates move away from π_old: the clip is taken
    assert float((_params(model) - before).abs().max()) > 0
    # the KL to the initial policy after those updates is positive
    m2 = grpo.grpo_update(model, grpo.make_optimizer(model, config), batches, config, reference=reference)
    assert m2.updates == 1 and m2.kl_initial > 1e-6


def test_one_update_is_grpo_step():
    """M = E = 1 is the reference step: the same parameters after it."""
    a = load_model(str(TINY)).requires_grad_(True)
    b = copy.deepcopy(a)
    seqs = _on_policy(a)
    config = grpo.GrpoConfig(lr=1e-3)
    ma = grpo.grpo_step(a, grpo.make_optimizer(a, config), MicroBatches(Selection(seqs, {}, []), 128, "per_sequence"),
                        config)
    mb = grpo.grpo_update(b, grpo.make_optimizer(b, config), MicroBatches(Selection(seqs, {}, []), 128,
                                                                            "per_sequence"), config)
    assert mb.loss == pytest.approx(ma.loss, abs=1e-6)
    assert torch.allclose(_params(a), _params(b), atol=1e-7)


def test_entropy_matches_a_hand_computation():
    model = load_model(str(TINY))
    seqs = _on_policy(model, 2)
    batches = MicroBatches(Selection(seqs, {}, []), 4096, "per_sequence")
    ent, kl = grpo._measure(model, batches)
    hand, n = 0.0, 0
    with torch.no_grad():
        for s in seqs:
            logits = model(input_ids=torch.from_numpy(s.input_ids)[None]).logits[0, :-1].float()
            p = torch.softmax(logits, -1)
            e = -(p * torch.log_softmax(logits, -1)).sum(-1)
            mask = torch.from_numpy(s.loss_mask[1:])
            hand += float((e * mask).sum())
            n += int(mask.sum())
    assert kl is None and ent == pytest.approx(hand / n, rel=1e-5)


def _results(tmp_path: Path, groups: dict[str, list[float]]) -> Path:
    rows = [{"task": g, "k": k, "group": f"run/{g}", "status": "completed", "reward": r}
            for g, rs in groups.items() for k, r in enumerate(rs)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_groups_without_spread(tmp_path):
    r = rewards_of(_results(tmp_path, {"a": [0.0, 0.0], "b": [0.2, 0.4], "c": [1.0, 1.0]}))
    assert r["groups"] == 3 and r["groups_without_spread"] == 2 and r["samples"] == 6
    assert r["reward_mean"] == pytest.approx(2.6 / 6)
    assert r["reward_std"] == pytest.approx(float(np.std([0, 0, 0.2, 0.4, 1, 1])))


def test_eval_pass_at_1_is_the_mean_over_tasks_of_each_resolved_share(tmp_path):
    # a: 1 of 2 resolved; b: reward 1 but reward.json says not resolved, and a sample without a reward (left out);
    # c: only a sample without a reward (no task to count): (1/2 + 0) / 2
    rows = [{"task": "a", "k": 0, "group": "g/a", "status": "completed", "reward": 1.0},
            {"task": "a", "k": 1, "group": "g/a", "status": "completed", "reward": 0.0},
            {"task": "b", "k": 0, "group": "g/b", "status": "completed", "reward": 1.0,
             "reward_details": {"reward": 1, "resolved": False}},
            {"task": "b", "k": 1, "group": "g/b", "status": "infra_error", "reward": None},
            {"task": "c", "k": 0, "group": "g/c", "status": "verifier_error", "reward": None}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rewards_of(tmp_path)["pass_at_1"] == pytest.approx(0.25)
    line = polar_train.step_summary({**_summary_line(), "eval_reward": 0.5, "eval_pass_at_1": 0.25})
    assert "eval reward 0.500, pass@1 0.250" in line


def _summary_line() -> dict:
    keys = ("step", "weight_version", "samples", "statuses", "reward_mean", "verify_median_abs_gap",
            "verify_share_within", "ratio_mean", "ratio_max", "clip_share", "loss", "tokens_trainable",
            "tokens_forward")
    return {**dict.fromkeys(keys), "seconds": {}}


def test_default_lr_is_picked_from_the_model():
    params = count_params(TINY)
    assert 2_000_000 < params < 4_000_000
    lr, mini, epochs, why = default_lr(params)
    assert (lr, mini, epochs) == (1e-2, 2, 8) and "small model" in why
    lr, mini, epochs, _ = default_lr(134_515_008)  # SmolLM2-135M
    assert 1e-5 <= lr <= 5e-5 and (mini, epochs) == (2, 1)


def test_task_draw_is_seeded_and_covers_the_family():
    tasks = [str(FAMILIES / "digit-share" / "train")]
    plan = Plan(tasks=tasks, agent="a", model="m", steps=8, samples=2, lr=1e-2, weight_decay=0, clip=0.2,
                tis_cap=None, micro_batch_tokens=4096, dtype="float32", sampling="", rollout_cmd="x",
                tasks_per_step=4, seed=5)
    draws = [tasks_of_step(plan, s) for s in range(1, 9)]
    assert all(len(d) == 4 == len(set(d)) for d in draws)
    assert draws == [tasks_of_step(plan, s) for s in range(1, 9)]  # the same on --resume
    assert len({t for d in draws for t in d}) > 8  # many prompts of the family, not one
    plan.seed = 6
    assert [tasks_of_step(plan, s) for s in range(1, 9)] != draws
    assert len(task_dirs(tasks)) == 32


def test_prune_keeps_the_newest_and_the_serving_one(tmp_path):
    for s in range(1, 6):
        (tmp_path / "checkpoints" / f"step-{s:04d}").mkdir(parents=True)
    gone = polar_train.prune_checkpoints(tmp_path, 2, keep=tmp_path / "checkpoints" / "step-0005")
    assert gone == ["step-0001", "step-0002", "step-0003"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-0004", "step-0005"]


@pytest.mark.parametrize("family", ["digit-share", "vowel-share", "upper-share", "letter-share", "digit-steps"])
def test_family_tasks_score_0_empty_and_1_solved(tmp_path, family):
    """Every generated task: distinct prompts, the empty start state scores 0.0 and the solution 1.0 (and a family of
    steps' state scorer, tests/progress.sh, the same); the tree holds what the generator writes."""
    fresh = tmp_path / "gen"
    subprocess.run([sys.executable, str(FAMILIES / "generate.py"), "--family", family, "--out", str(fresh)], check=True,
                   capture_output=True)
    files = lambda d: {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}  # noqa
    assert files(fresh / family) == files(FAMILIES / family), "rerun examples/tasks/families/generate.py"
    tasks = sorted((FAMILIES / family).glob("*/*/task.toml"))
    assert len(tasks) == 40
    assert len({(t.parent / "instruction.md").read_text() for t in tasks}) == 40
    for toml in tasks[:3] + tasks[-2:]:
        task = toml.parent
        scores = []
        for solved in (False, True):
            app, logs = tmp_path / task.name / str(solved) / "app", tmp_path / task.name / str(solved) / "logs"
            app.mkdir(parents=True)
            if solved:
                subprocess.run(["bash", str(task / "solution" / "solve.sh")], cwd=app, check=True)
            for script in ("test.sh", "progress.sh"):
                if (task / "tests" / script).is_file():
                    subprocess.run(["bash", str(task / "tests" / script)], check=True,
                                   env={"PATH": "/usr/bin:/bin", "POLAR_APP": str(app), "POLAR_LOGS": str(logs)})
                    scores.append(float((logs / "reward.txt").read_text()))
        steps = (task / "tests" / "progress.sh").is_file()
        assert steps == (family == "digit-steps")
        assert scores == ([0.0, 0.0, 1.0, 1.0] if steps else [0.0, 1.0]), task
    if family == "digit-steps":  # the state scorer counts each note present: two of three solved notes
        app, logs = tmp_path / "partial" / "app", tmp_path / "partial" / "logs"
        app.mkdir(parents=True)
        for n, text in ((1, "2026 x"), (2, "abc")):  # 4 digits of 5, none of 3, note3 missing
            (app / f"note{n}.txt").write_text(text)
        subprocess.run(["bash", str(tasks[0].parent / "tests" / "progress.sh")], check=True,
                       env={"PATH": "/usr/bin:/bin", "POLAR_APP": str(app), "POLAR_LOGS": str(logs)})
        assert float((logs / "reward.txt").read_text()) == pytest.approx(0.8 / 3, abs=1e-6)


def test_the_learning_knobs_reach_train_json_the_config_and_the_controller(tmp_path):
    """--clip-high, --entropy-coef/--entropy-target, --advantage-norm, --normalize (issue 41): train.json records
    them and the trainer's GrpoConfig and entropy controller are built from them; the choices are the processor's."""
    from polar.processor import rewards
    from polar.trainer import plan as plan_module

    args = plan_module.parser().parse_args([
        str(FAMILIES / "digit-share" / "train"), "--agent", "pi", "--model", str(TINY), "--out", str(tmp_path / "run"),
        "--clip-high", "0.28", "--entropy-coef", "0.01", "--entropy-target", "2.5", "--advantage-norm", "mean",
        "--normalize", "rollout", "--rollout-cmd", sys.executable])
    plan_module.check_args(args)
    plan, run = polar_train.prepare(args)
    raw = json.loads((run / "train.json").read_text())
    assert {k: raw[k] for k in ("clip", "clip_high", "entropy_coef", "entropy_target", "advantage_norm",
                                "normalize")} == {"clip": 0.2, "clip_high": 0.28, "entropy_coef": 0.01,
                                                  "entropy_target": 2.5, "advantage_norm": "mean",
                                                  "normalize": "rollout"}
    trainer = polar_train.Trainer.load(Plan(**raw), str(TINY))
    assert (trainer.config.clip, trainer.config.eps_high, trainer.config.normalize) == (0.2, 0.28, "rollout")
    assert (trainer.entropy.coef, trainer.entropy.target, trainer.entropy.applied()) == (0.01, 2.5, 0.0)
    assert plan_module.ADVANTAGE_NORMS == rewards.ADVANTAGE_NORMS
    defaults = plan_module.parser().parse_args(["--out", "x"])
    assert (defaults.clip_high, defaults.entropy_coef, defaults.entropy_target, defaults.advantage_norm,
            defaults.normalize) == (None, 0.0, None, "std", "token")  # the defaults stay (issue 41: a campaign decides)


def test_the_entropy_controller_survives_a_checkpoint(tmp_path):
    from polar.trainer.state import read_state, restore, write_state

    model = load_model(str(TINY))
    opt = grpo.make_optimizer(model, grpo.GrpoConfig())
    saved = grpo.EntropyControl(coef=0.035, target=0.2, last_entropy=0.15)
    write_state(str(tmp_path), optimizer=opt, step=3, cursor=4, line={"step": 3}, entropy=saved)
    back = grpo.EntropyControl(coef=0.0, target=0.2)
    restore(read_state(tmp_path), opt, back)
    assert (back.coef, back.last_entropy, back.applied()) == (0.035, 0.15, 0.035)
    write_state(str(tmp_path), optimizer=opt, step=3, cursor=4, line={"step": 3})  # a run without a controller
    fresh = grpo.EntropyControl(coef=0.0, target=0.2)
    restore(read_state(tmp_path), opt, fresh)
    assert (fresh.coef, fresh.last_entropy) == (0.0, float("inf"))
