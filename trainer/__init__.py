"""polar.trainer — the trainer side (DESIGN §10): exports to trainer formats, the loader, logprob verification, the
reference GRPO step, checkpoints and the training loop. torch is imported only inside this package, and only by the
modules that need it (`export` runs in the base install)."""
