"""polar.integrations — stock trainers driving the loop: the top floor. It may import polar.trainer, polar.launch,
polar.records and polar.rollout.serve_protocol (through the trainer's rollout stage); nothing imports it.

- `polar.integrations.trl`: TRL's GRPOTrainer (`rollout_func`), extra `[trl]`.
- `polar.integrations.rows`: one row per sample of a processed polar-rollout RUN (what a trainer that takes one
  completion per sample wants)."""
