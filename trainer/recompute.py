"""The trainer's logprob of every token, computed the way the sampler recorded it: the stored ids with no tokenizer
call, logits at t−1 for token t, a log-softmax over the raw logits (vLLM's `raw_logprobs`, so only calls sampled at
T=1/top_p=1/top_k=-1 compare), positions 0..L−1 per sequence.

Position t of the result holds the logprob of token t, like the `logprobs` column; position 0 of every sequence
(and of every packed segment) has no context and holds 0. Shared by the loader's users: polar-verify (under
no_grad) and the GRPO step (with gradients)."""

from __future__ import annotations

import os

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(model_dir: str, dtype: str = "float32"):
    """A causal LM from an HF directory, in `dtype`, with dropout off (eval mode: the sampler has none)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # a bar per load would bury the tools' one-line results
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
    model.eval()
    return model


def model_problem(model_dir: str) -> str | None:
    """Why `model_dir` is not an HF model directory transformers can load, or None."""
    if not os.path.isdir(model_dir):
        return f"{model_dir}: not a directory"
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        return f"{model_dir}: no config.json (pass an HF model directory)"
    if not any(n.endswith((".safetensors", ".bin")) for n in os.listdir(model_dir)):
        return f"{model_dir}: no weights (*.safetensors)"
    return None


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[B, L] float32: position t = log p(input_ids[:, t] | input_ids[:, :t]); position 0 = 0.

    Padded rows pass `attention_mask` (right padding); packed rows pass `position_ids` restarting at every sequence
    and no attention mask, from which transformers builds the block-diagonal causal mask."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    logits = out.logits[:, :-1].float()
    # logsumexp + gather instead of a full log_softmax: one [B, L, V] temporary fewer.
    picked = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0))
