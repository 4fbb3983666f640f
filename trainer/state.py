"""What a checkpoint holds beside the weights, for `polar-train --resume` (docs/training.md#resume):
RUN/checkpoints/step-000N/trainer_state.pt — the optimizer's state (AdamW's moments and step counts), the RNG states
(Python's `random`, torch's CPU generator), the entropy controller's coefficient and last measurement, the step and
the sample cursor (the next step whose rollout has not been asked for), and the step's train.jsonl line.

The file is written into the checkpoint's temporary directory, so it appears with the weights or not at all
(polar.trainer.checkpoint.save_checkpoint's `extra`). The line makes a kill between the checkpoint and train.jsonl
harmless: --resume finds a checkpoint newer than train.jsonl's last step, publishes it and appends its line — the
step is not trained again. vLLM reads only the *.safetensors of the directory; this file is the trainer's."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

STATE_FILE = "trainer_state.pt"
STATE_VERSION = 1


def write_state(directory: str, *, optimizer, step: int, cursor: int, line: dict, entropy=None) -> str:
    """trainer_state.pt in `directory` (a checkpoint being written); its path. `entropy`: the grpo.EntropyControl."""
    import torch

    path = os.path.join(directory, STATE_FILE)
    torch.save({"version": STATE_VERSION, "step": step, "cursor": cursor, "optimizer": optimizer.state_dict(),
                "random": random.getstate(), "torch_rng": torch.get_rng_state(),
                "line": json.dumps(line, allow_nan=False),
                "entropy": None if entropy is None else [float(entropy.coef), float(entropy.last_entropy)]}, path)
    return path


def read_state(checkpoint: str | Path) -> dict | None:
    """The state saved with `checkpoint` (its line decoded), None when it has none (the starting model, or a
    checkpoint written before states were saved)."""
    import torch

    path = Path(checkpoint) / STATE_FILE
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    state["line"] = json.loads(state["line"])
    return state


def restore(state: dict, optimizer, entropy=None) -> None:
    """The optimizer, the RNGs and `entropy` (a grpo.EntropyControl; a state saved before it was kept leaves it as it
    is) as they were when `state` was saved."""
    import torch

    if entropy is not None and state.get("entropy") is not None:
        entropy.coef, entropy.last_entropy = state["entropy"]
    optimizer.load_state_dict(state["optimizer"])
    random.setstate(_as_tuple(state["random"]))
    torch.set_rng_state(state["torch_rng"])


def _as_tuple(value):
    """random.getstate()'s nested tuples, which a round trip may return as lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def pending(run: Path, done: int) -> Path | None:
    """The newest checkpoint of a step after `done` (train.jsonl's last step) that holds a state: trained and saved,
    but killed before its line was appended (during publication, or just before)."""
    found = None
    for ckpt in sorted((run / "checkpoints").glob("step-*")):
        try:
            step = int(ckpt.name.split("-", 1)[1])
        except ValueError:
            continue
        if step > done and (ckpt / STATE_FILE).is_file():
            found = ckpt
    return found
