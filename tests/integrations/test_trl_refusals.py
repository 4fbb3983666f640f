"""PolarRollout refuses what it cannot run with, in one line and before anything starts (no vLLM, no serve): a TRL
outside 1.16.x, num_generations ≠ samples, TRL's temperature ≠ the sampler's, a PEFT model, a vLLM not in dev mode,
accelerate seeing fewer processes than WORLD_SIZE, per-token credit, polar-train's --normalize rollout; at a
round, a prompt that is no task id of TASKS and a batch that is not whole groups. The trainer here is a stand-in with the attributes PolarRollout reads; each case changes one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.integrations.conftest import FAMILY, TINY

ONE = str(FAMILY / "digit-share-000")


class Accelerator:
    num_processes, process_index, is_main_process = 1, 0, True

    def unwrap_model(self, model):
        return model


def trainer(**changes) -> SimpleNamespace:
    model = SimpleNamespace(config=SimpleNamespace(_name_or_path=str(TINY)), training=True)
    base = dict(accelerator=Accelerator(), num_generations=2, num_generations_eval=2, temperature=1.0, model=model,
                args=SimpleNamespace(seed=1), state=SimpleNamespace(global_step=0))
    base.update(changes)
    return SimpleNamespace(**base)


def refused(rollout, prompts, t) -> str:
    from polar.integrations.trl import PolarRolloutError

    with pytest.raises(PolarRolloutError) as caught:
        rollout(prompts, t)
    line = str(caught.value)
    assert "\n" not in line
    assert rollout.stage is None and not rollout.out.exists()  # nothing was started, OUT as it was
    return line


def rollout_of(tmp_path: Path, **kw):
    from polar.integrations.trl import PolarRollout

    return PolarRollout(ONE, agent="python:polar.rollout.sdk_agent:answer", out=tmp_path / "run", samples=2, **kw)


def test_trl_outside_the_pinned_minor(tmp_path, monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.17.0")
    assert "trl 1.17.0 is not supported" in refused(rollout_of(tmp_path), ["digit-share-000"] * 2, trainer())


def test_group_size_and_samples_differ(tmp_path):
    line = refused(rollout_of(tmp_path), ["digit-share-000"] * 4, trainer(num_generations=4))
    assert "num_generations=4" in line and "samples=2" in line


def test_a_peft_model(tmp_path):
    model = SimpleNamespace(config=SimpleNamespace(_name_or_path=str(TINY)), training=True, peft_config={})
    assert "a PEFT model" in refused(rollout_of(tmp_path), ["digit-share-000"] * 2, trainer(model=model))


def test_accelerate_alone_under_torchrun(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "use_cpu=True" in refused(rollout_of(tmp_path), ["digit-share-000"] * 2, trainer())


def test_a_prompt_that_is_no_task(tmp_path):
    line = refused(rollout_of(tmp_path), ["what is 2+2?"] * 2, trainer())
    assert "'what is 2+2?' is not among TASKS" in line


def test_a_batch_that_splits_a_group(tmp_path):
    assert "not a multiple of the group size 2" in refused(rollout_of(tmp_path), ["digit-share-000"] * 3, trainer())
    mixed = refused(rollout_of(tmp_path), ["digit-share-000", "digit-share-001"], trainer())
    assert "not one task repeated 2 times" in mixed


def test_temperature_differs_from_the_sampler(tmp_path, monkeypatch):
    r = rollout_of(tmp_path, sampling="temperature=0.7,top_p=1.0,top_k=-1")
    monkeypatch.setattr(r, "_server", lambda: pytest.fail("the vLLM was reached before the check"))
    assert "TRL's temperature 1 ≠ the serve's sampling temperature 0.7" in refused(r, ["digit-share-000"] * 2,
                                                                                    trainer())


def test_a_vllm_not_in_dev_mode(tmp_path):
    from polar.launch.runfiles import VllmRunFile

    run_file = tmp_path / "vllm.json"
    VllmRunFile(pid=1, port=1, base_url="http://127.0.0.1:1/v1", model="tiny", dev=False).write(run_file)
    line = refused(rollout_of(tmp_path, vllm=str(run_file)), ["digit-share-000"] * 2, trainer())
    assert "not in dev mode" in line and str(run_file) in line


def test_construction_refusals(tmp_path):
    from polar.integrations.trl import PolarRolloutError

    with pytest.raises(PolarRolloutError, match="a GRPO group needs ≥ 2 samples"):
        rollout_of(tmp_path).__class__(ONE, agent="a", out=tmp_path, samples=1)
    with pytest.raises(PolarRolloutError, match="no Harbor task"):
        rollout_of(tmp_path).__class__(tmp_path, agent="a", out=tmp_path)
    with pytest.raises(PolarRolloutError, match="needs vllm=RUN_FILE"):
        rollout_of(tmp_path, serve=str(tmp_path))


@pytest.mark.parametrize("opts", [["--process-opt=--credit=turn"], ["--process-opt", "--credit=turn"],
                                  ["--process-opt=--credit", "--process-opt=turn"]])
def test_turn_credit(tmp_path, opts):
    from polar.integrations.trl import PolarRolloutError

    with pytest.raises(PolarRolloutError) as caught:
        rollout_of(tmp_path, rollout_opts=opts)
    assert "--credit turn" in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()
    rollout_of(tmp_path, rollout_opts=["--process-opt=--credit=session"])  # session credit is TRL's own


def test_rollout_normalize(tmp_path):
    """polar-train's --normalize rollout has no way into TRL's loss: refused in one line (issue 41)."""
    from polar.integrations.trl import PolarRolloutError

    with pytest.raises(PolarRolloutError) as caught:
        rollout_of(tmp_path, normalize="rollout")
    assert "--normalize rollout" in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()
    rollout_of(tmp_path, normalize="token")  # token weighting is TRL's dapo loss
