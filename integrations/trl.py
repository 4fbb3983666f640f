"""TRL's `GRPOTrainer` trains unmodified agents through Polar: `PolarRollout` is its `rollout_func`.

    rollout = PolarRollout(TASKS, agent="python:polar.rollout.sdk_agent:answer", out="runs/trl", samples=4)
    trainer = GRPOTrainer(model=..., processing_class=tokenizer, reward_funcs=polar_reward,
                          train_dataset=task_dataset(TASKS), rollout_func=rollout,
                          args=GRPOConfig(num_generations=4, use_vllm=False, ...))
    with rollout:
        trainer.train()

A *round* is one call of the rollout function (one generation batch of TRL's; `global_step` counts optimizer
steps). Each round:
1. publication — when the weights changed since the last publication (and before the first round, so every record
   names the weights that sampled it): every process takes part in accelerate's `get_state_dict` (a collective, so
   sharded setups work), the main process writes the HF directory OUT/weights/trl-<global_step> and publishes it
   (`polar.launch.publish`: the serve's proxy held, every replica reloaded) as version `trl-<global_step>`; all wait.
   Only the published weights and the ones before stay on disk.
2. rollout — the process's prompts (task ids; TRL's RepeatSampler puts each dataset row `num_generations` times in a
   row) go to the run's one `polar-rollout serve` (OUT/rollout, started by the main process) in blocks of K: one
   block is one group (one task, K samples). Requests and run ids carry the round and the process index, so every
   session (and so every per-call seed, which the proxy derives from the seed and the session) is the run's own.
3. rows — one per prompt, in order (`polar.integrations.rows`): `prompt_ids` = the session sequence's first call's
   prompt, `completion_ids` = the rest, `logprobs` = the sampler's, `env_mask` = the trainer loader's mask,
   `polar_reward` (None without a reward: TRL leaves such a row out of its group's baseline, advantage 0),
   `polar_session`, `polar_weight_version`.
4. the on-policy check — with `use_vllm=False` TRL computes π_old itself and our recorded logprobs never enter its
   loss, so the rollouts are on-policy only because the weights were published before them. One no-grad pass of the
   trainer's model over the rows measures it: `polar/verify_within` (the share of trainable tokens whose recorded
   logprob is within 0.01 nats of the model's) and `polar/verify_max_gap`.
Metrics go into TRL's own log (so `report_to` carries them), reduced over processes (counts summed, gaps and seconds
maxed, shares minimised): `polar/rollout_seconds`, `polar/publish_seconds`, `polar/weight_version`,
`polar/unrewarded`, `polar/sequences_left_out`, `polar/no_sequence`, `polar/verify_within`, `polar/verify_max_gap`
and `polar/status/<status>`. Each round's rows are also written to OUT/rounds/<kind>-<step>/p<rank>.json, with the
sequences left out named and the digest of the process's parameters; each publication is a line of
OUT/publications.jsonl.

Refused with one line (PolarRolloutError) before the first round: a TRL outside 1.16.x, `num_generations` ≠
`samples`, a vLLM not in dev mode, TRL's `temperature` ≠ the serve's, a PEFT model; and at any round a task id not
among TASKS or a per-process batch that is not whole groups (a group split over processes would be rolled out
twice). The serve, its proxy and a vLLM this object started end with `close()` (a `with` block, or at exit)."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from polar.integrations.rows import RunRows, SampleRow, read_rows
from polar.launch import vllm as launch_vllm
from polar.records.files import write_json_atomic
from polar.trainer.plan import DEFAULT_SAMPLING, rollout_command, task_dirs
from polar.trainer.rollout_stage import RolloutService, ServeSettings

TRL_VERSIONS = ((1, 16), (1, 17))  # [from, to): the rollout_func contract was read in trl 1.16.0's grpo_trainer.py
STATUSES = ("completed", "agent_error", "agent_timeout", "verifier_timeout", "verifier_error", "infra_error",
            "cancelled")  # the rollout ledger's (docs/contracts.md)
WITHIN_NATS = 0.01
VERIFY_TOKENS = 4096  # tokens per no-grad micro-batch of the on-policy check


class PolarRolloutError(ValueError):
    """A setting PolarRollout cannot run with: one line naming the fix."""


def task_ids(tasks) -> dict[str, str]:
    """{task id: task directory} of TASKS (task directories or folders of them)."""
    paths = task_dirs([str(t) for t in ([tasks] if isinstance(tasks, (str, os.PathLike)) else tasks)])
    out: dict[str, str] = {}
    for p in paths:
        name = Path(p).name
        if name in out and out[name] != p:
            raise PolarRolloutError(f"two tasks share the id {name!r} ({out[name]}, {p}): give them distinct names")
        out[name] = p
    if not out:
        raise PolarRolloutError(f"no Harbor task (a directory with task.toml) in {tasks}")
    return out


def task_dataset(tasks):
    """A `datasets.Dataset` with one row per task, its `prompt` the task id (a plain string keeps TRL on its
    non-conversational path; the agent sees the task's own instruction, not this string)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": list(task_ids(tasks))})


def polar_reward(completions, polar_reward, **_):
    """The reward function for GRPOTrainer: each sample's verified reward, None where it has none (TRL's
    unscorable rule: no reward is not 0)."""
    return [None if r is None else float(r) for r in polar_reward]


def _sampling_temperature(sampling: str) -> float:
    for part in sampling.split(","):
        key, _, value = part.partition("=")
        if key.strip() == "temperature":
            return float(value)
    return 1.0


def _run_prefix(out: Path) -> str:
    return re.sub(r"[^A-Za-z0-9-]+", "-", out.name).strip("-") or "trl"


class PolarRollout:
    """TRL's `rollout_func` (see the module docstring). `vllm`: the run file of a running dev-mode vLLM (or pool)
    serving the model TRL trains; None starts one (`dtype`) and stops it at the end. `serve`: the directory of a
    running `polar-rollout serve` to use (it keeps running at the end; its proxy's sampling override is the one it
    was started with, which `sampling` must then name); None starts one in OUT/rollout. `rollout_opts`: more
    polar-rollout arguments (e.g. `--sandbox=bwrap`). `seed`: the per-call sampler seed (None: TRL's `args.seed`).
    `model_dir`: the HF directory whose tokenizer and config the published weights are saved with (None: the
    model's `name_or_path`). `last_rows` holds this process's rows of the last round."""

    def __init__(self, tasks, agent: str, out, samples: int = 4, vllm: str | None = None, rollout_opts=(),
                 seed: int | None = None, *, serve: str | None = None, sampling: str | None = None,
                 model_dir: str | None = None, dtype: str = "float32", verify: bool = True,
                 rollout_cmd: str | None = None, normalize: str = "token"):
        self.tasks = task_ids(tasks)
        _refuse_rollout_normalize(normalize)
        if samples < 2:
            raise PolarRolloutError(f"samples={samples}: a GRPO group needs ≥ 2 samples")
        if serve is not None and vllm is None:
            raise PolarRolloutError(f"serve={serve} needs vllm=RUN_FILE: the server behind it, which each round "
                                    "publishes to")
        _refuse_turn_credit(rollout_opts)
        self.serve = Path(serve).resolve() if serve is not None else None
        self.agent, self.out, self.samples = agent, Path(out).resolve(), samples
        self.vllm, self.rollout_opts, self.seed = vllm, tuple(rollout_opts), seed
        self.sampling, self.model_dir, self.dtype, self.verify = sampling, model_dir, dtype, verify
        self.rollout_cmd = rollout_cmd
        self.stage: RolloutService | None = None
        self.run_file: str | None = None
        self._vllm_ours = False
        self._serve_ours = False
        self._main = False
        self.published: int | None = None
        self.published_dirs: list[Path] = []
        self.last_rows: list[SampleRow] = []
        self.rounds = 0
        self._digest: str | None = None

    # ------------------------------------------------------------------------------------------------ life

    def __enter__(self) -> "PolarRollout":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the serve (its proxy with it) and the vLLM this object started; idempotent."""
        stage, self.stage = self.stage, None
        if stage is not None and self._serve_ours:
            stage.stop()
        if self._vllm_ours and self.run_file:
            self._vllm_ours = False
            launch_vllm.stop(self.run_file, log=_say)

    # ------------------------------------------------------------------------------------------------ a round

    def __call__(self, prompts: list, trainer) -> dict:
        acc = trainer.accelerator
        if self.stage is None:
            self._check_settings(trainer)
        mode = "train" if trainer.model.training else "eval"
        k = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        blocks = self._blocks(prompts, k)
        if self.stage is None:
            self._start(trainer)
        t0 = time.monotonic()
        self._publish(trainer)
        publish_s = time.monotonic() - t0
        self._digest = params_digest(acc.unwrap_model(trainer.model))
        t1 = time.monotonic()
        rows, runs = self._roll(blocks, k, trainer.state.global_step, mode, acc.process_index,
                                trainer.processing_class)
        rollout_s = time.monotonic() - t1
        within, checked, max_gap = self._check(trainer, rows) if self.verify else (0, 0, 0.0)
        self.last_rows = rows
        self.rounds += 1
        self._report(trainer.state.global_step, mode, acc.process_index, rows, runs,
                     {"within": within, "checked": checked, "max_gap": max_gap, "rollout_seconds": rollout_s,
                      "publish_seconds": publish_s})
        self._log(trainer, mode, rows, runs, within, checked, max_gap, rollout_s, publish_s)
        return {"prompt_ids": [r.prompt_ids for r in rows], "completion_ids": [r.completion_ids for r in rows],
                "logprobs": [r.logprobs for r in rows], "env_mask": [r.env_mask for r in rows],
                "polar_reward": [r.reward for r in rows], "polar_session": [r.session for r in rows],
                "polar_weight_version": [r.weight_version for r in rows]}

    def _blocks(self, prompts: list, k: int) -> list[str]:
        """The task id of each block of K prompts; PolarRolloutError for anything else."""
        if len(prompts) % k:
            raise PolarRolloutError(f"this process got {len(prompts)} prompts, not a multiple of the group size {k}: "
                                    "make per_device_train_batch_size × steps_per_generation a multiple of "
                                    "num_generations (a group split over processes would be rolled out twice)")
        blocks = []
        for b in range(0, len(prompts), k):
            block = prompts[b:b + k]
            if any(p != block[0] for p in block):
                raise PolarRolloutError(f"prompts {b}..{b + k - 1} are not one task repeated {k} times (TRL's "
                                        f"RepeatSampler gives each row num_generations times in a row): {block}")
            if not isinstance(block[0], str) or block[0] not in self.tasks:
                known = ", ".join(sorted(self.tasks)[:5]) + (" …" if len(self.tasks) > 5 else "")
                raise PolarRolloutError(f"task {block[0]!r} is not among TASKS ({known}): the dataset's prompts must "
                                        "be task ids (task_dataset(TASKS))")
            blocks.append(block[0])
        return blocks

    # ------------------------------------------------------------------------------------------------ start

    def _start(self, trainer) -> None:
        """The services: the main process starts them, the others wait and attach."""
        acc = trainer.accelerator
        sampling = self.sampling or f"{DEFAULT_SAMPLING},seed_per_call={self.seed if self.seed is not None else trainer.args.seed}"
        if abs(_sampling_temperature(sampling) - float(trainer.temperature)) > 1e-9:
            raise PolarRolloutError(f"TRL's temperature {trainer.temperature:g} ≠ the serve's sampling temperature "
                                    f"{_sampling_temperature(sampling):g}: TRL divides its logits by its own, so set "
                                    "GRPOConfig(temperature=…) to the sampler's")
        try:
            cmd = rollout_command(self.rollout_cmd)
        except ValueError as exc:
            raise PolarRolloutError(str(exc)) from None
        settings = ServeSettings(agent=self.agent, model=self.model_dir, sampling=sampling, rollout_cmd=cmd,
                                 rollout_opt=self.rollout_opts)
        self._main = acc.is_main_process
        if self._main:
            # a resumed run's earlier publications: still pruned to the last two
            self.published_dirs = sorted((self.out / "weights").glob("trl-*"), key=lambda d: int(d.name[4:])
                                         if d.name[4:].isdigit() else -1)
            self.run_file = self._server()
            self.out.mkdir(parents=True, exist_ok=True)
            atexit.register(self.close)
            _end_on_sigterm()
        stage = RolloutService(settings, self.out, "", directory=self.serve)
        self._serve_ours = self._main and self.serve is None
        if self._serve_ours:
            stage.url = launch_vllm.read_any(self.run_file).base_url
            _say(f"starting polar-rollout serve {stage.dir} (one proxy, one preflight for the whole run)")
            stage.start()
        acc.wait_for_everyone()
        if not self._serve_ours:
            stage.attach()
        self.stage = stage

    def _check_settings(self, trainer) -> None:
        import trl

        have = tuple(int(x) for x in re.findall(r"\d+", trl.__version__)[:2])
        if not TRL_VERSIONS[0] <= have < TRL_VERSIONS[1]:
            raise PolarRolloutError(f"trl {trl.__version__} is not supported: polar.integrations.trl is built on "
                                    f"trl 1.16.x (pip install 'polar-gateway[trl]')")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if trainer.accelerator.num_processes != world:
            raise PolarRolloutError(f"accelerate sees {trainer.accelerator.num_processes} process(es) but WORLD_SIZE="
                                    f"{world}: on a CPU pass GRPOConfig(use_cpu=True, ddp_backend='gloo'), or each "
                                    "process trains alone (its rewards and advantages not gathered)")
        if trainer.num_generations != self.samples:
            raise PolarRolloutError(f"GRPOConfig(num_generations={trainer.num_generations}) ≠ PolarRollout(samples="
                                    f"{self.samples}): one group is one task's K samples; make them equal")
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "peft_config"):
            raise PolarRolloutError("a PEFT model: the serving vLLM takes whole weights, and adapters are not merged "
                                    "for publication here; train the full model (or merge the adapters first)")
        if self.model_dir is None:
            self.model_dir = getattr(model.config, "_name_or_path", None) or getattr(model, "name_or_path", None)
        if not self.model_dir or not (Path(self.model_dir) / "config.json").is_file():
            raise PolarRolloutError(f"the model's directory {self.model_dir!r} is no HF directory: pass "
                                    "PolarRollout(model_dir=DIR) (its tokenizer and config go with each publication)")
        self.model_dir = str(Path(self.model_dir).resolve())

    def _server(self) -> str:
        """The vLLM run file: `vllm` (checked: dev mode, every replica of a pool), or a dev-mode one started."""
        if self.vllm is not None:
            info = launch_vllm.read_any(self.vllm)
            if info is None:
                raise PolarRolloutError(f"vllm={self.vllm}: no vLLM run file ({launch_vllm.command()} start --dev "
                                        "writes one)")
            infos = launch_vllm.replica_infos(info) if hasattr(info, "replicas") else [info]
            if any(i is None or not i.dev for i in infos):
                raise PolarRolloutError(f"vllm={self.vllm}: that server is not in dev mode ({launch_vllm.command()} "
                                        "start --dev): it cannot take the trainer's weights between rounds")
            return str(self.vllm)
        run_file = self.out / "vllm.json"
        self.out.mkdir(parents=True, exist_ok=True)
        if run_file.is_file() and launch_vllm.status(run_file) is not None:  # a resumed run: its server still runs
            self._vllm_ours = True
            return str(run_file)
        spec = launch_vllm.StartSpec(model=self.model_dir, dtype=self.dtype, dev=True, run_file=run_file)
        try:
            launch_vllm.start(spec, log=_say)
        except launch_vllm.Fail as exc:
            raise PolarRolloutError(f"vLLM did not start: {str(exc).splitlines()[0] if str(exc) else exc}") from None
        self._vllm_ours = True
        return str(run_file)

    # ------------------------------------------------------------------------------------------------ publication

    def _publish(self, trainer) -> None:
        """Publish the trainer's weights as trl-<global_step> when they are not the published ones."""
        step = trainer.state.global_step
        if self.published == step:
            return
        from polar.trainer.checkpoint import save_checkpoint
        from polar.trainer.train import reload

        acc = trainer.accelerator
        state = acc.get_state_dict(trainer.model)  # every process: a collective under sharding
        if self._main:
            t0 = time.monotonic()
            weights = self.out / "weights" / f"trl-{step}"
            save_checkpoint(acc.unwrap_model(trainer.model), str(weights), self.model_dir, state_dict=state)
            saved = time.monotonic() - t0
            reload(step, self.run_file, weights, f"trl-{step}", self.stage.proxies())
            with open(self.out / "publications.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": step, "version": f"trl-{step}", "weights": str(weights),
                                     "save_seconds": round(saved, 3),
                                     "publish_seconds": round(time.monotonic() - t0 - saved, 3),
                                     "t": time.time()}) + "\n")
            self.published_dirs = [d for d in self.published_dirs if d != weights] + [weights]
            for old in self.published_dirs[:-2]:  # the published weights and the ones before stay
                shutil.rmtree(old, ignore_errors=True)
            self.published_dirs = self.published_dirs[-2:]
        del state
        acc.wait_for_everyone()
        self.published = step

    # ------------------------------------------------------------------------------------------------ rollout

    def _roll(self, blocks: list[str], k: int, step: int, mode: str, rank: int,
              tokenizer) -> tuple[list[SampleRow], list[RunRows]]:
        """Ask the serve for this process's groups and read back one row per prompt, in order."""
        pad = getattr(tokenizer, "pad_token_id", None)
        pad = pad if pad is not None else getattr(tokenizer, "eos_token_id", 0)
        # the j-th time a task appears goes to run j: a run holds each task once
        seen: Counter = Counter()
        where = []
        for task in blocks:
            where.append((seen[task], task))
            seen[task] += 1
        per_run = [[t for j, t in where if j == n] for n in range(max(seen.values()))]
        kind = "train" if mode == "train" else "eval"
        base = self.out / "rounds" / f"{kind}-{step:06d}"
        asked = []
        for j, tasks in enumerate(per_run):
            suffix = f"p{rank}" + (f"-{j}" if j else "")
            out = base / suffix
            run_id = f"{_run_prefix(self.out)}-{kind}{step}-{suffix}"
            name = self.stage.ask(out, [self.tasks[t] for t in tasks], k, run_id, f"{kind}-{step:06d}-{suffix}")
            asked.append((name, out))
        runs = []
        for name, out in asked:
            self.stage.answer(name, out, step, unrewarded_ok=True)  # TRL: no reward is no score, not a failure
            runs.append(read_rows(out, pad))
        rows = []
        for j, task in where:
            for i in range(k):
                row = runs[j].rows.get((task, i))
                if row is None:
                    raise PolarRolloutError(f"{asked[j][1]}: no result for task {task} sample {i}")
                rows.append(row)
        return rows, runs

    # ------------------------------------------------------------------------------------------------ check

    def _check(self, trainer, rows: list[SampleRow]) -> tuple[int, int, float]:
        """(tokens within WITHIN_NATS, tokens checked, the largest gap) of the trainer's model against the recorded
        logprobs, over every trainable token: one no-grad pass."""
        import numpy as np
        import torch

        from polar.trainer.loader import SequenceTokens, build, group_indices
        from polar.trainer.recompute import token_logprobs

        seqs = [SequenceTokens(str(i), np.asarray(r.prompt_ids + r.completion_ids, np.int64),
                               np.asarray([0] * len(r.prompt_ids) + r.env_mask, np.float32),
                               np.asarray([0.0] * len(r.prompt_ids) + r.logprobs, np.float32))
                for i, r in enumerate(rows) if r.trainable]
        if not seqs:
            return 0, 0, 0.0
        model = trainer.accelerator.unwrap_model(trainer.model)
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        within, checked, max_gap = 0, 0, 0.0
        try:
            with torch.no_grad():
                for group in group_indices([s.n_tokens for s in seqs], VERIFY_TOKENS, "per_sequence"):
                    mb = build([seqs[i] for i in group], "per_sequence")
                    inputs = {key: (v.to(device) if v is not None else None) for key, v in mb.model_inputs().items()}
                    got = token_logprobs(model, **inputs).float().cpu()
                    on = mb.loss_mask > 0
                    gap = (got - mb.old_logprobs).abs()[on]
                    within += int((gap <= WITHIN_NATS).sum())
                    checked += int(on.sum())
                    max_gap = max(max_gap, float(gap.max()) if gap.numel() else 0.0)
        finally:
            model.train(was_training)
        return within, checked, max_gap

    # ------------------------------------------------------------------------------------------------ report

    def _report(self, step: int, mode: str, rank: int, rows: list[SampleRow], runs: list[RunRows],
                figures: dict) -> None:
        kind = "train" if mode == "train" else "eval"
        path = self.out / "rounds" / f"{kind}-{step:06d}" / f"p{rank}.json"
        doc = {"step": step, "mode": mode, "process": rank, "weight_version": f"trl-{self.published}",
               "params_sha256": self._digest,
               "rows": [{"task": r.task, "k": r.k, "status": r.status, "reward": r.reward, "session": r.session,
                         "sequence_id": r.sequence_id, "trainable": r.trainable, "weight_version": r.weight_version}
                        for r in rows],
               "sequences_left_out": [s for run in runs for s in run.left_out],
               "counts": _sum_counts(runs), **figures}
        write_json_atomic(path, doc)

    def _log(self, trainer, mode: str, rows: list[SampleRow], runs: list[RunRows], within: int, checked: int,
             max_gap: float, rollout_s: float, publish_s: float) -> None:
        """The round's figures in TRL's metrics, reduced over processes."""
        import torch

        acc = trainer.accelerator
        counts = _sum_counts(runs)
        statuses = Counter(r.status for r in rows)
        share = within / checked if checked else 1.0
        local = torch.tensor([[counts.get("unrewarded", 0), counts.get("sequences_left_out", 0),
                               counts.get("no_sequence", 0), counts.get("mismatch_masked", 0),
                               counts.get("sampling_tokens_left_out", 0), counts.get("constrained_tokens_left_out", 0),
                               checked, max_gap, share, rollout_s, publish_s,
                               *(statuses.get(s, 0) for s in STATUSES)]], dtype=torch.float64, device=acc.device)
        every = acc.gather(local).cpu()
        summed, maxed, mins = every.sum(0), every.max(0).values, every.min(0).values
        metrics = trainer._metrics[mode]
        for i, key in enumerate(("unrewarded", "sequences_left_out", "no_sequence", "mismatch_masked",
                                 "sampling_tokens_left_out", "constrained_tokens_left_out", "verify_checked")):
            metrics[f"polar/{key}"].append(float(summed[i]))
        metrics["polar/verify_max_gap"].append(float(maxed[7]))
        metrics["polar/verify_within"].append(float(mins[8]))
        metrics["polar/rollout_seconds"].append(float(maxed[9]))
        metrics["polar/publish_seconds"].append(float(maxed[10]))
        metrics["polar/weight_version"].append(float(self.published))
        for i, status in enumerate(STATUSES):
            metrics[f"polar/status/{status}"].append(float(summed[11 + i]))


def process_options(rollout_opts) -> list[str]:
    """The polar-process arguments among polar-rollout's (`--process-opt ARG` / `--process-opt=ARG`), in order."""
    opts, out = list(rollout_opts), []
    for i, arg in enumerate(opts):
        if arg.startswith("--process-opt="):
            out.append(arg.split("=", 1)[1])
        elif arg == "--process-opt" and i + 1 < len(opts):
            out.append(opts[i + 1])
    return out


def _refuse_turn_credit(rollout_opts) -> None:
    """TRL's GRPOTrainer computes one advantage per completion from `polar_reward`: per-token credit
    (polar-process --credit turn) has no way in, so it is refused rather than silently trained as session credit."""
    args = process_options(rollout_opts)
    pairs = [a.split("=", 1)[1] if a.startswith("--credit=") else args[i + 1] if a == "--credit" and i + 1 < len(args)
             else None for i, a in enumerate(args)]
    if "turn" in pairs:
        raise PolarRolloutError("polar-process --credit turn: TRL's GRPOTrainer takes one advantage per completion, "
                                "so per-call credit cannot reach it; use --credit session here, or train with "
                                "polar-train (or export verl / prime-rl) for turn credit")


def _refuse_rollout_normalize(normalize: str) -> None:
    """polar-train's --normalize rollout (each session weighs one in the loss) is polar-train's loss; no
    GRPOTrainer subclass here carries it, so it is refused rather than silently trained token-weighted."""
    if normalize != "token":
        raise PolarRolloutError(f"normalize={normalize!r}: TRL's GRPOTrainer weighs tokens by its own loss_type and no "
                                "subclass here carries polar-train's --normalize rollout; with one row per session, "
                                "GRPOConfig(loss_type='grpo') (each completion's token mean) is the per-rollout mean of "
                                "the rows TRL trains, or train with polar-train --normalize rollout")


def params_digest(model) -> str:
    """sha256 over the model's parameters (names and bytes, in order): equal on every process of a data-parallel
    run after each optimizer step."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _sum_counts(runs: list[RunRows]) -> dict[str, int]:
    total: Counter = Counter()
    for run in runs:
        total.update({k: v for k, v in run.counts.items() if v})
    return dict(total)


def _say(msg: str) -> None:
    print(f"polar.integrations.trl: {msg}", file=sys.stderr, flush=True)


def _end_on_sigterm() -> None:
    """SIGTERM ends the process through SystemExit, so `close()` (at exit) ends the services; a handler the
    program set is left alone."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
