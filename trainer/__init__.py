"""polar.trainer — the trainer side (docs/architecture.md#the-trainer-side): exports to trainer formats, the loader,
logprob verification, the reference GRPO step, checkpoints and the training loop. torch is imported only inside this
package, and only by the modules that need it (`export` runs in the base install)."""

import importlib.util


def has_trainer_env() -> bool:
    """torch and transformers are importable (the trainer environment, `scripts/setup --train`)."""
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


def needs_trainer_env(tool: str) -> str:
    """The one line a console script prints, exiting 2, when `has_trainer_env()` is false: a checkout's setup
    command, else the pip extra (an installed wheel has no scripts/)."""
    from polar.launch import paths

    return f"{tool} needs the trainer environment (torch, transformers): " + paths.fix(
        checkout=f"scripts/setup --train, then .venv-train/bin/{tool}",
        installed="pip install 'polar-gateway[train]' (Python 3.11+)")
