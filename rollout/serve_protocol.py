"""`polar.rollout.serve_protocol`, the name the trainer side and users import (docs/own-trainer.md): the same module
object as polar.rollout.serve.protocol, its home. Standard library only, like it."""

import sys

from polar.rollout.serve import protocol

sys.modules[__name__] = protocol
