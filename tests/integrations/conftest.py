"""tests/integrations runs in .venv-train (torch, TRL; scripts/test starts that session): the proxy's .venv has
neither, and its session leaves this directory to the other one.

Fixtures shared by every TRL test (one vLLM and one serve for all of them):
- `dev_server`: the float32 dev-mode tiny vLLM of the whole .venv-train session (tests/support/dev_server.py), put
  back on the original weights after each test that publishes (`restored`).
- `trl_serve`: one `polar-rollout serve` in bwrap in front of it (exact mode, sampling pinned to T=1/top_p=1/top_k=-1,
  seed_per_call=SEED): every PolarRollout of the session submits to it (`serve=`), so no test pays a proxy start
  and a preflight. Its preflight ran the python answer agent; another agent gets its own in its first run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

TRL = importlib.util.find_spec("trl") is not None and importlib.util.find_spec("torch") is not None
if not TRL:
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / ".cache" / "models" / "tiny"
ANSWER_AGENT = "python:polar.rollout.sdk_agent:answer"
FAMILY = ROOT / "examples" / "tasks" / "families" / "digit-share" / "train"
SEED = 1
SAMPLING = f"temperature=1.0,top_p=1.0,top_k=-1,seed_per_call={SEED}"
POLAR_ROLLOUT = ROOT / ".venv" / "bin" / "polar-rollout"


def pytest_report_header(config):
    if not TRL:
        return "tests/integrations: left to the .venv-train session (no torch or trl here; scripts/test runs both)"
    return None


@pytest.fixture(scope="session")
def dev_server():
    from tests.support.dev_server import shared

    return shared()


@pytest.fixture
def restored(dev_server):
    """The shared server, given its original weights back when the test ends."""
    from tests.support.dev_server import restore

    yield dev_server
    restore(dev_server)


@pytest.fixture(scope="session")
def trl_serve(dev_server, tmp_path_factory):
    from tests.support.need import need

    need(None if POLAR_ROLLOUT.exists() else f"{POLAR_ROLLOUT} is missing", setup="scripts/setup")
    need(None if shutil.which("bwrap") else "bwrap is not installed")
    from polar.trainer.rollout_stage import RolloutService, ServeSettings

    run = tmp_path_factory.mktemp("trl-serve")
    settings = ServeSettings(agent=ANSWER_AGENT, model=str(TINY), sampling=SAMPLING, rollout_cmd=str(POLAR_ROLLOUT),
                             rollout_opt=("--sandbox=bwrap",))
    stage = RolloutService(settings, run, dev_server.base_url)
    stage.start()
    yield stage.dir
    stage.stop()


def load_example():
    """examples/trl/grpo.py as a module (examples/ sit above the package)."""
    spec = importlib.util.spec_from_file_location("trl_grpo_example", ROOT / "examples" / "trl" / "grpo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def example_args(tasks, out: Path, server, serve: Path, *extra: str) -> list[str]:
    return [*(str(t) for t in ([tasks] if isinstance(tasks, (str, os.PathLike)) else tasks)),
            "--agent", ANSWER_AGENT, "--model", str(TINY), "--out", str(out), "--vllm", server.run_file,
            "--serve", str(serve), "--seed", str(SEED), *extra]
