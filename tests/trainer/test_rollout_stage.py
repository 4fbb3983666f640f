"""polar-train's rollout stage (trainer/rollout_stage.py) without a serve: which --rollout-opt flags go to the serve
and which to each step's request, and --warm-agents added for a python: agent in bwrap unless said otherwise."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from polar.trainer.rollout_stage import RolloutService, split_opts

pytestmark = pytest.mark.unit


def test_serve_flags_go_to_the_serve_and_the_rest_to_each_run():
    serve, each = split_opts(["--sandbox", "bwrap", "--parallel=3", "--skip-preflight", "--agent-timeout=60",
                              "--no-warm-agents", "--turn-states", "hold"])
    assert serve == ["--sandbox", "bwrap", "--parallel=3", "--skip-preflight", "--turn-states", "hold"]
    assert each == ["--agent-timeout=60", "--no-warm-agents"]


@pytest.mark.parametrize("agent, sandbox, opts, turn_states, warm", [
    ("python:polar.rollout.sdk_agent:answer", "bwrap", [], "off", True),
    ("python:polar.rollout.sdk_agent:answer", "none", ["--sandbox=none"], "off", False),
    ("python:polar.rollout.sdk_agent:answer", "docker", ["--sandbox=docker"], "off", False),
    ("pi", "bwrap", [], "off", False),
    ("python:polar.rollout.sdk_agent:answer", "bwrap", ["--no-warm-agents"], "off", False),
    ("python:polar.rollout.sdk_agent:answer", "bwrap", ["--warm-agents"], "off", True),
    # a serve snapshotting samples at their calls (its ready.json says): samples in sandboxes of their own (a slot
    # moves /app away); a ready.json from before the field: off
    ("python:polar.rollout.sdk_agent:steps", "bwrap", ["--turn-states=hold"], "hold", False),
    ("python:polar.rollout.sdk_agent:steps", "bwrap", ["--turn-states", "async"], "async", False),
    ("python:polar.rollout.sdk_agent:steps", "bwrap", ["--turn-states=off"], "off", True),
    ("python:polar.rollout.sdk_agent:steps", "bwrap", [], None, True),
])
def test_a_python_agent_in_bwrap_runs_warm_unless_said(tmp_path: Path, agent, sandbox, opts, turn_states, warm):
    service = RolloutService(SimpleNamespace(rollout_opt=opts, agent=agent), tmp_path, "http://127.0.0.1:1/v1")
    service.ready = SimpleNamespace(sandbox=sandbox, turn_states=turn_states)
    args = service.run_args()
    assert args.count("--warm-agents") == (1 if warm else 0), args
    assert ("--no-warm-agents" in args) == ("--no-warm-agents" in opts)


def test_each_step_is_processed_with_the_runs_advantage_norm(tmp_path: Path):
    """polar-train --advantage-norm reaches polar-process through each step's request (issue 41)."""
    plan = SimpleNamespace(rollout_opt=[], agent="pi", model="/m", advantage_norm="mean")
    request = RolloutService(plan, tmp_path, "http://127.0.0.1:1/v1")._request(tmp_path / "s", ["t"], 4, "r", True)
    assert request.process_opt == ("--tokenizer=/m", "--advantage-norm=mean")
    eval_request = RolloutService(plan, tmp_path, "http://127.0.0.1:1/v1")._request(tmp_path / "e", ["t"], 2, "e",
                                                                                    False)
    assert eval_request.no_process and eval_request.process_opt == ()
