"""TRL's GRPOTrainer drives the loop through PolarRollout (polar.integrations.trl): TRL 1.16 with use_vllm=False,
the tiny model in float32, the shared dev-mode vLLM and the shared serve (conftest.py), the python answer agent in
bwrap. What TRL receives is compared with the flow records the proxy wrote, id for id."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integrations.conftest import FAMILY, ROOT, SEED, example_args, load_example
from tests.support.need import need

pytestmark = pytest.mark.vllm


def flow_records(flows: Path) -> dict[str, list[dict]]:
    """{session: its records in file order} of a flow directory (prompts in the compact form resolved)."""
    from polar import records

    resolver = records.PromptResolver()
    out: dict[str, list[dict]] = {}
    for _, _, rec in records.iter_files(records.expand_inputs([str(flows)])):
        rec = resolver.resolve(rec)
        if rec.get("session"):
            out.setdefault(rec["session"], []).append(rec)
    return out


def test_1_three_rounds_exact_rows_published_versions(restored, trl_serve, tmp_path):
    """3 rounds: loss finite, parameters changed; the ids TRL received are the records' ids; every call of a round
    carries the version published before it; polar/verify_within is 1.0 every round."""
    import torch

    example = load_example()
    out = tmp_path / "run"
    args = example.parser().parse_args(example_args(FAMILY, out, restored, trl_serve, "--rounds", "3",
                                                    "--lr", "1e-2", "--mini-batches", "1", "--epochs", "1"))
    trainer, rollout = example.build(args)
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    received: list[tuple[int, dict]] = []
    inner = rollout.__call__

    class Spy:  # what TRL received, with the global step it asked at
        def __call__(self, prompts, trainer_):
            result = inner(prompts, trainer_)
            received.append((trainer_.state.global_step, result))
            return result

    trainer.rollout_func = Spy()
    with rollout:
        trainer.train()

    losses = [ln["loss"] for ln in trainer.state.log_history if "loss" in ln]
    assert losses and all(math.isfinite(x) for x in losses), losses
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"

    assert [step for step, _ in received] == [0, 1, 2]
    rounds = sorted((out / "rounds").iterdir())
    assert [r.name for r in rounds] == ["train-000000", "train-000001", "train-000002"]
    recs = flow_records(trl_serve / "flows")  # every record the serve's proxy wrote
    from polar import records

    for step, result in received:
        assert len(result["prompt_ids"]) == 8  # 2 tasks × K=4, one row per prompt
        for i, session in enumerate(result["polar_session"]):
            calls = recs[session]
            last = calls[-1]
            whole = records.token_ids(last, "prompt_token_ids") + records.token_ids(last, "completion_token_ids")
            assert result["prompt_ids"][i] + result["completion_ids"][i] == whole, session
            first_prompt = records.token_ids(calls[0], "prompt_token_ids")
            assert result["prompt_ids"][i] == first_prompt
            assert {c["weight_version"] for c in calls} == {f"trl-{step}"}, (session, step)
            assert result["polar_weight_version"][i] == f"trl-{step}"
            n = len(result["completion_ids"][i])
            assert len(result["logprobs"][i]) == len(result["env_mask"][i]) == n
            assert sum(result["env_mask"][i]) == sum(len(records.token_ids(c, "completion_token_ids")) for c in calls)
    lines = [ln for ln in trainer.state.log_history if "polar/weight_version" in ln]
    assert [ln["polar/weight_version"] for ln in lines] == [0.0, 1.0, 2.0]
    assert all(ln["polar/verify_within"] == 1.0 for ln in lines), lines
    assert all(ln["polar/verify_checked"] > 0 for ln in lines), lines
    report = json.loads((out / "rounds" / "train-000002" / "p0.json").read_text())
    assert report["weight_version"] == "trl-2" and len(report["rows"]) == 8
    assert sorted(p.name for p in (out / "weights").iterdir()) == ["trl-1", "trl-2"]  # the published and the one before


# -- the example as a user runs it ----------------------------------------------------------------------------------

EXAMPLE = ROOT / "examples" / "trl" / "grpo.py"
PY = ROOT / ".venv-train" / "bin" / "python"
RUN_TIMEOUT = 1800  # a generous bound for one training run on a loaded 2-core machine (not a speed claim)


def run_example(*args: str, launcher: tuple[str, ...] = (str(PY),), script: Path = EXAMPLE,
                env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("HTTPS_PROXY", "https_proxy", "PYTEST_CURRENT_TEST")}
    full_env.update(TRL_EXPERIMENTAL_SILENCE="1", **(env or {}))
    proc = subprocess.run([*launcher, str(script), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env=full_env, stdin=subprocess.DEVNULL, cwd=ROOT)
    out = Path(args[args.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.log", "a", encoding="utf-8") as log:  # the whole of both, for a failure
        log.write(f"$ {' '.join([*launcher, str(script), *args])}\n{proc.stdout}\n{proc.stderr}\n")
    return proc


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def rise(rewards: list[float]) -> float:
    return sum(rewards[-3:]) / 3 - sum(rewards[:3]) / 3


LEARN_SEED = int(os.environ.get("POLAR_TEST_LEARN_SEED", str(SEED)))
LEARN_RISE, CONTROL_RISE = 0.15, 0.05


def test_2_it_learns_and_the_lr0_control_does_not(restored, trl_serve, tmp_path):
    """digit-share, K=4, 2 tasks a round, 12 rounds, the example's settings (the learning rate and the M·E updates
    polar-train picks for the tiny model): the mean reward of the last 3 rounds beats the first 3 by ≥ 0.15; the
    same 12 rounds at lr=0 (the weights never change) rise by less than 0.05. The seed is SEED unless
    POLAR_TEST_LEARN_SEED says another (docs/training.md lists every seed run); the serve's sampler seed is SEED."""
    common = ("--rounds", "12", "--samples", "4", "--tasks-per-round", "2", "--seed", str(LEARN_SEED))
    learn, control = tmp_path / "learn", tmp_path / "control"
    proc = run_example(*example_args(FAMILY, learn, restored, trl_serve), *common)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # lr 0: the weights never change, so one update a round draws the same policy's samples as sixteen would
    ctl = run_example(*example_args(FAMILY, control, restored, trl_serve), *common, "--lr", "0",
                      "--mini-batches", "1", "--epochs", "1")
    assert ctl.returncode == 0, ctl.stdout[-3000:] + ctl.stderr[-5000:]
    got, base = summary(learn)["rounds"], summary(control)["rounds"]
    rewards, controls = [r["reward"] for r in got], [r["reward"] for r in base]
    if os.environ.get("POLAR_TEST_MEASURE"):
        print(f"\nseed {LEARN_SEED}: rise {rise(rewards):+.3f} {[round(r, 3) for r in rewards]}; control "
              f"{rise(controls):+.3f} {[round(r, 3) for r in controls]}")
    assert len(rewards) == len(controls) == 12
    assert all(r["polar/verify_within"] == 1.0 for r in got + base)
    assert [r["polar/weight_version"] for r in got] == [16.0 * i for i in range(12)]  # M·E = 2·8 steps a round
    assert [r["polar/weight_version"] for r in base] == [float(i) for i in range(12)]
    assert rise(rewards) >= LEARN_RISE, rewards
    assert rise(controls) < CONTROL_RISE, controls


def test_3_two_processes(restored, trl_serve, tmp_path):
    """torchrun --nproc_per_node 2 (gloo): 2 rounds; each round two rollout runs (one per process, distinct
    sessions), one publication (the main process's), and the parameters equal on both processes after each round."""
    out = tmp_path / "run"
    torchrun = (str(ROOT / ".venv-train" / "bin" / "torchrun"), "--nproc_per_node", "2", "--master_port",
                str(free_port()))
    proc = run_example(*example_args(FAMILY, out, restored, trl_serve), "--rounds", "2", "--samples", "2",
                       "--tasks-per-round", "2", "--lr", "1e-2", "--mini-batches", "1", "--epochs", "1",
                       launcher=torchrun)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert summary(out)["world"] == 2
    pubs = [json.loads(x) for x in (out / "publications.jsonl").read_text().splitlines()]
    assert [p["version"] for p in pubs] == ["trl-0", "trl-1"]  # once a round, by one process
    for step in (0, 1):
        reports = [json.loads((out / "rounds" / f"train-{step:06d}" / f"p{r}.json").read_text()) for r in (0, 1)]
        sessions = [{row["session"] for row in rep["rows"]} for rep in reports]
        assert all(len(s) == 2 for s in sessions) and not sessions[0] & sessions[1]
        runs = [json.loads((out / "rounds" / f"train-{step:06d}" / f"p{r}" / "run.json").read_text()) for r in (0, 1)]
        assert runs[0]["run_id"] != runs[1]["run_id"]
        assert reports[0]["params_sha256"] == reports[1]["params_sha256"]
        assert {row["weight_version"] for rep in reports for row in rep["rows"]} == {f"trl-{step}"}
    finals = {(out / f"params-p{r}.sha256").read_text() for r in (0, 1)}
    assert len(finals) == 1
    first = json.loads((out / "rounds" / "train-000001" / "p0.json").read_text())["params_sha256"]
    assert first != json.loads((out / "rounds" / "train-000000" / "p0.json").read_text())["params_sha256"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_4_a_real_cli_without_reward_spread(restored, trl_serve, tmp_path):
    """Pi in bwrap on hello-file, the tiny model, K=2, 2 rounds: no group has a reward spread (a random model
    writes no hello.txt), so every advantage is 0 and TRL goes on; every call of every session is recorded and
    reaches TRL's row."""
    pi = ROOT / ".cache" / "npm" / "node_modules" / ".bin" / "pi"
    need(None if os.access(pi, os.X_OK) else f"{pi} is missing", setup="scripts/setup --clis")
    out = tmp_path / "run"
    args = example_args(ROOT / "examples" / "tasks" / "hello-file", out, restored, trl_serve)
    args[args.index("--agent") + 1] = "pi"
    proc = run_example(*args, "--rounds", "2", "--samples", "2", "--tasks-per-round", "1", "--lr", "1e-2",
                       "--mini-batches", "1", "--epochs", "1", "--rollout-opt=--agent-timeout=240")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = summary(out)["rounds"]
    assert len(got) == 2 and all(r["frac_reward_zero_std"] == 1.0 for r in got), got
    assert all(r["polar/status/completed"] + r["polar/status/agent_error"] == 2 for r in got), got
    recs = flow_records(trl_serve / "flows")
    for step in (0, 1):
        run = out / "rounds" / f"train-{step:06d}" / "p0"
        results = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
        for res in results:
            assert res["calls"] >= 1 and len(recs[res["session"]]) == res["calls"], res
            assert {c["weight_version"] for c in recs[res["session"]]} == {f"trl-{step}"}
        rows = json.loads((out / "rounds" / f"train-{step:06d}" / "p0.json").read_text())["rows"]
        assert sorted(r["session"] for r in rows) == sorted(res["session"] for res in results)


def test_5_a_verifier_error_is_no_reward(restored, trl_serve, tmp_path):
    """A task whose verifier writes no reward: every sample ends verifier_error, its polar_reward is None (counted
    in polar/unrewarded), and no reward of 0 appears anywhere — TRL scores such rows unscorable."""
    task = tmp_path / "tasks" / "broken-verifier"
    shutil.copytree(FAMILY / "digit-share-000", task)
    (task / "tests" / "test.sh").write_text("#!/usr/bin/env bash\necho 'no reward written' >&2\nexit 3\n")
    out = tmp_path / "run"
    proc = run_example(*example_args(task, out, restored, trl_serve), "--rounds", "1", "--samples", "2",
                       "--tasks-per-round", "1", "--lr", "1e-2", "--mini-batches", "1", "--epochs", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (line,) = summary(out)["rounds"]
    assert line["polar/unrewarded"] == 2 and line["polar/status/verifier_error"] == 2, line
    assert math.isnan(line["reward"]) if isinstance(line["reward"], float) else line["reward"] is None
    rows = json.loads((out / "rounds" / "train-000000" / "p0.json").read_text())["rows"]
    assert [r["reward"] for r in rows] == [None, None] and all(r["status"] == "verifier_error" for r in rows)


KILLER = '''
import os, signal, sys
sys.path.insert(0, sys.argv.pop(1))
import grpo
from transformers import TrainerCallback

class KillAfterSave(TrainerCallback):  # SIGKILL, as a power cut: no handler runs
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == int(os.environ["POLAR_TEST_KILL_AFTER_SAVE"]):
            os.kill(os.getpid(), signal.SIGKILL)

sys.exit(grpo.main(sys.argv[1:], callbacks=[KillAfterSave()]))
'''


def test_6_killed_after_a_checkpoint_resumes_on_its_weights(restored, trl_serve, tmp_path):
    """Killed right after round 2's checkpoint, then `--resume`: the first round after the resume is served by the
    resumed weights (published as trl-2, the checkpoint's tensors; polar/verify_within 1.0)."""
    out = tmp_path / "run"
    driver = tmp_path / "kill_after_save.py"
    driver.write_text(KILLER)
    args = (*example_args(FAMILY, out, restored, trl_serve), "--rounds", "3", "--samples", "2", "--tasks-per-round",
            "1", "--lr", "1e-2", "--mini-batches", "1", "--epochs", "1", "--save-every", "1")
    killed = run_example(str(EXAMPLE.parent), *args, script=driver, env={"POLAR_TEST_KILL_AFTER_SAVE": "2"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (out / "trl" / "checkpoint-2").is_dir() and not (out / "summary.json").exists()
    resumed = run_example(*args, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    after = [r for r in summary(out)["rounds"] if r["step"] > 2]
    assert [r["polar/weight_version"] for r in after] == [2.0], summary(out)["rounds"]
    assert after[0]["polar/verify_within"] == 1.0 and after[0]["polar/verify_checked"] > 0
    pubs = [json.loads(x) for x in (out / "publications.jsonl").read_text().splitlines()]
    assert [p["version"] for p in pubs] == ["trl-0", "trl-1", "trl-2"]
    from polar.launch.publish import same_weights

    assert same_weights(out / "trl" / "checkpoint-2", Path(pubs[-1]["weights"]))


# -- the objective, side by side ------------------------------------------------------------------------------------

@pytest.mark.parametrize("eps_high, entropy_coef", [(None, 0.0), (0.28, 0.0), (0.28, 0.05)])
def test_7_polar_train_loss_equals_trl_dapo_loss(tmp_path, eps_high, entropy_coef):
    """polar-train's loss (grpo.micro_batch_loss over Σ mask: the clipped terms and the entropy bonus) and TRL 1.16's
    `dapo` loss (`_compute_loss`, fed old_per_token_logps = our recorded logprobs, the same advantages and masks),
    float64, one process, no accumulation: equal loss and gradient within 1e-9, with ratios outside [1−ε, 1+ε] on
    both sides and advantages of both signs; --clip-high = TRL's epsilon_high (a ratio of 1.246 sits between the two
    high bounds), --entropy-coef = TRL's entropy_coef (its fixed coefficient: use_adaptive_entropy off). The differences by design are checked separately below: TRL's group std has ddof 1 and + 1e-4
    (ours: the population std), and its normaliser carries the process count and the accumulation factor."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from polar.trainer.grpo import GrpoConfig, micro_batch_loss
    from polar.trainer.loader import MicroBatch

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(ROOT / ".cache" / "models" / "tiny"), dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(str(ROOT / ".cache" / "models" / "tiny"))
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=lambda completions, **_: [0.0] * len(
        completions), train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
                          args=GRPOConfig(output_dir=str(tmp_path / "trl"), use_vllm=False, num_generations=2,
                                          per_device_train_batch_size=4, report_to="none", bf16=False,
                                          gradient_checkpointing=False, loss_type="dapo", epsilon=0.2,
                                          epsilon_high=eps_high, entropy_coef=entropy_coef))
    trainer.current_gradient_accumulation_steps = 1
    model.train()
    B, P, C = 4, 5, 7
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(10, 3000, (B, P), generator=gen)
    completion = torch.randint(10, 3000, (B, C), generator=gen)
    completion_mask = torch.ones(B, C, dtype=torch.long)
    completion_mask[1, 5:] = 0  # a shorter row (right padding)
    tool_mask = torch.ones(B, C, dtype=torch.long)
    tool_mask[2, 2:4] = 0  # tool output inside a completion
    advantages = torch.tensor([1.3, -0.7, 0.4, -1.1], dtype=torch.float64)
    ids = torch.cat([prompt, completion], 1)
    with torch.no_grad():  # the recorded logprobs: the model's, moved so that some ratios leave [0.8, 1.2] both ways
        logits = model(input_ids=ids).logits[:, :-1]
        now = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)[:, P - 1:]
    shift = torch.tensor([[0.5, -0.5, 0.05, -0.05, 0.3, -0.3, -0.22]] * B, dtype=torch.float64)
    recorded = now + shift
    mask = (completion_mask * tool_mask).double()

    inputs = {"prompt_ids": prompt, "prompt_mask": torch.ones(B, P, dtype=torch.long), "completion_ids": completion,
              "completion_mask": completion_mask, "tool_mask": tool_mask, "advantages": advantages,
              "old_per_token_logps": recorded, "num_items_in_batch": mask.sum()}

    def float64_logps(model_, input_ids, attention_mask, logits_to_keep, **_):
        """The objective is compared, not the forward: TRL's own forward (transformers' fused LM head) gives the
        log-probs in float32, ~1e-8 off float64 (checked below), so both losses are fed these."""
        out = torch.log_softmax(model_(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1], -1)
        picked = out.gather(-1, input_ids[:, 1:, None]).squeeze(-1)[:, -logits_to_keep:]
        entropy = -(out.exp() * out).sum(-1)[:, -logits_to_keep:]  # with gradient, as TRL's (entropy_requires_grad)
        return picked, entropy, None

    with torch.no_grad():
        trl_forward = trainer._get_per_token_logps_and_entropies(model, ids, torch.ones_like(ids), C)[0]
    assert float((trl_forward - now).abs().max()) < 1e-5  # TRL's float32 log-probs agree with ours
    trainer._get_per_token_logps_and_entropies = float64_logps
    model.zero_grad()
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    grad_theirs = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    logits = model(input_ids=ids).logits[:, :-1]
    log_p = torch.log_softmax(logits, -1)
    logprobs = torch.nn.functional.pad(log_p.gather(-1, ids[:, 1:, None]).squeeze(-1), (1, 0))
    entropy = torch.nn.functional.pad(-(log_p.exp() * log_p).sum(-1), (1, 0))
    zeros = torch.zeros(B, P, dtype=torch.float64)
    loss_mask = torch.cat([zeros, mask], 1)
    mb = MicroBatch("per_sequence", ids, torch.ones_like(ids), torch.arange(P + C).expand(B, -1), loss_mask,
                    torch.cat([zeros, recorded], 1), advantages[:, None] * loss_mask, [str(i) for i in range(B)],
                    [(i, 0, P + C) for i in range(B)], None)
    ours, stats = micro_batch_loss(logprobs, entropy, mb, GrpoConfig(clip=0.2, clip_high=eps_high),
                                   int(loss_mask.sum()), entropy_coef)
    ours.backward()
    grad_ours = [p.grad.clone() for p in model.parameters()]

    ratio = torch.exp(-shift)[mask > 0]
    assert (ratio > 1.28).any() and (ratio < 0.8).any() and stats["clipped"] > 0
    assert ((ratio > 1.2) & (ratio < 1.28)).any()  # clipped at ε_high 0.2, not at 0.28
    assert abs(float(ours.detach()) - float(theirs.detach())) <= 1e-9, (float(ours), float(theirs))
    assert max(float((a - b).abs().max()) for a, b in zip(grad_ours, grad_theirs)) <= 1e-9

    # by design 1: the group advantage. TRL: (r − mean) / (std with ddof 1 + 1e-4); ours: the population std.
    from polar.processor.rewards import advantages as polar_advantages
    from trl.trainer.utils import nanstd

    rewards = torch.tensor([0.2, 0.9, 0.5, 0.1], dtype=torch.float64)
    trl_adv = (rewards - rewards.mean()) / (nanstd(rewards) + 1e-4)
    ours_adv = polar_advantages({f"s{i}": (float(r), "g") for i, r in enumerate(rewards)})
    n = len(rewards)
    for i, r in enumerate(rewards):
        pop = float(rewards.std(unbiased=False))
        assert ours_adv[f"s{i}"] == pytest.approx(float(r - rewards.mean()) / pop, abs=1e-12)
        # (nanstd's n/(n−1) is a float32 division: 1e-7 relative)
        assert float(trl_adv[i]) == pytest.approx(float(r - rewards.mean()) / (pop * (n / (n - 1)) ** 0.5 + 1e-4),
                                                  rel=1e-7)
        assert abs(float(trl_adv[i]) - ours_adv[f"s{i}"]) > 0.01 * abs(ours_adv[f"s{i}"])  # the rules differ (by design)
    # by design 2: TRL's normaliser is num_items_in_batch / processes × accumulation / steps_per_generation
    trainer.current_gradient_accumulation_steps = 2
    model.zero_grad()
    halved = trainer._compute_loss(model, inputs)
    assert float(halved) == pytest.approx(float(theirs) / 2, rel=1e-12)


def test_8_an_exception_in_training_ends_the_serve_it_started(restored, tmp_path):
    """PolarRollout without `serve=` starts its own polar-rollout serve (OUT/rollout); an exception out of TRL's
    loop ends it, and its proxy, on the way out of the `with` block."""
    from transformers import TrainerCallback

    from polar.rollout import serve_protocol as protocol

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise RuntimeError("the trainer failed")

    example = load_example()
    out = tmp_path / "run"
    argv = example_args(FAMILY, out, restored, tmp_path)
    del argv[argv.index("--serve"):argv.index("--serve") + 2]
    args = example.parser().parse_args([*argv, "--rounds", "2", "--samples", "2", "--tasks-per-round", "1", "--lr",
                                        "1e-2", "--mini-batches", "1", "--epochs", "1",
                                        "--rollout-opt=--sandbox=bwrap", "--rollout-opt=--skip-preflight"])
    trainer, rollout = example.build(args, callbacks=[Boom()])
    with pytest.raises(RuntimeError, match="the trainer failed"):
        with rollout:
            trainer.train()
    ready = out / "rollout" / protocol.READY
    ended = json.loads((out / "rollout" / protocol.ENDED).read_text())
    assert not ready.exists() and ended["exit"] == 0, ended
    assert protocol.pid_start(ended["pid"]) is None  # the serve process is gone
