"""polar.trainer.checkpoint (docs/architecture.md#the-trainer-side): a saved step is a complete HF directory.

Scenarios:
1.1 the saved directory loads back in transformers with equal parameters, and has every file vLLM needs;
1.2 saving over an existing checkpoint replaces it whole (no stale shard, no temporary left);
1.3 a directory that lacks a file is named for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from polar.trainer.checkpoint import checkpoint_problems, save_checkpoint
from polar.trainer.recompute import load_model
from tests.support.need import need

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / ".cache" / "models" / "tiny"


@pytest.fixture(scope="module")
def trained():
    """The tiny model with every parameter nudged, as after a step (so equality is not the source's by luck)."""
    need(None if (TINY / "config.json").is_file() else f"no tiny model at {TINY}", setup="scripts/setup --models")
    model = load_model(str(TINY))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(1e-3 * (i + 1))
    return model


def test_1_1_saved_directory_loads_back_equal_and_is_complete(tmp_path, trained):
    out = save_checkpoint(trained, str(tmp_path / "step-0001"), str(TINY))
    assert checkpoint_problems(out) == []
    files = {p.name for p in Path(out).iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja"} <= files
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (Path(out) / name).read_bytes() == (TINY / name).read_bytes()  # copied, never re-created
    assert json.loads((Path(out) / "config.json").read_text())["model_type"] == "qwen2"
    back = load_model(out)
    a, b = dict(trained.named_parameters()), dict(back.named_parameters())
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    source = dict(load_model(str(TINY)).named_parameters())
    assert not torch.equal(source["model.embed_tokens.weight"], b["model.embed_tokens.weight"])


def test_1_2_saving_again_replaces_the_directory(tmp_path, trained):
    out = tmp_path / "step-0001"
    save_checkpoint(trained, str(out), str(TINY))
    (out / "stale.safetensors.index.json").write_text("{}")
    save_checkpoint(trained, str(out), str(TINY))
    assert not (out / "stale.safetensors.index.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0001"]


def test_1_3_a_missing_file_is_named(tmp_path, trained):
    out = Path(save_checkpoint(trained, str(tmp_path / "ck"), str(TINY)))
    (out / "chat_template.jinja").unlink()
    (out / "generation_config.json").unlink()
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    problems = checkpoint_problems(str(out))
    assert "no generation_config.json" in problems
    assert any("chat template" in p for p in problems)
