"""TRL's GRPOTrainer drives the loop through PolarRollout (polar.integrations.trl): TRL 1.16 with use_vllm=False,
the tiny model in float32, the shared dev-mode vLLM and the shared serve (conftest.py), the python answer agent in
bwrap. What TRL receives is compared with the flow records the proxy wrote, id for id."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.integrations.conftest import FAMILY, example_args, load_example

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
