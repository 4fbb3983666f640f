"""`python -m polar.rollout.pyagent MODULE:FUNC` — the name users type (README, docs/own-trainer.md); the runner
itself is polar.rollout.agents.pyagent."""

import sys

from polar.rollout.agents.pyagent import main

if __name__ == "__main__":
    sys.exit(main())
