"""tests/trainer runs in .venv-train (torch; scripts/test starts that session). The proxy's .venv has no torch: its
session leaves this directory to the other one and says so in its header.

Fixtures shared by the verify, reload and loop tests (one float32 dev-mode tiny server for all of them):
- `dev_server`: the tiny model in float32 with VLLM_SERVER_DEV_MODE=1 (`scripts/vllm start --dtype float32 --dev`),
  started once per session, shared with tests/integrations (tests/support/dev_server.py). A test that reloads other weights restores the original ones before it ends.
- `exact_rollout`: one polar-rollout run (the proxy's .venv, as a subprocess) against it: the SDK agent on the
  vowel-share task, K=4, exact mode, sampling pinned to T=1/top_p=1/top_k=-1, no sandbox; the RUN directory
  (RUN/out holds sequences.parquet and batches/).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

TORCH = importlib.util.find_spec("torch") is not None
if not TORCH:
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[2]
PROXY_VENV = ROOT / ".venv"
POLAR_ROLLOUT = PROXY_VENV / "bin" / "polar-rollout"
SDK_AGENT = "python:polar.rollout.sdk_agent:run"
ANSWER_AGENT = "python:polar.rollout.sdk_agent:answer"  # one free-text turn: a reward spread under a random policy
TRAIN_TASK = ROOT / "examples" / "tasks" / "vowel-share"
PINNED = "polar_sampling_override=temperature=1.0,top_p=1.0,top_k=-1"


def pytest_report_header(config):
    if not TORCH:
        return "tests/trainer: left to the .venv-train session (no torch here; scripts/test runs both)"
    return None


def rollout(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """polar-rollout from the proxy's environment (never imported here: mitmproxy needs Python 3.12)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HTTPS_PROXY", "https_proxy", "PYTEST_CURRENT_TEST")}
    return subprocess.run([str(POLAR_ROLLOUT), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def exact_rollout_args(upstream: str, out: Path, *, samples: int = 4, run_id: str = "train-exact",
                       exact: bool = True) -> list[str]:
    return [str(TRAIN_TASK), "--agent", SDK_AGENT, "--out", str(out), "--sandbox", "none", "--upstream", upstream,
            "--samples", str(samples), "--parallel", "2", "--run-id", run_id, "--skip-preflight",
            "--proxy-set", f"polar_exact={'true' if exact else 'false'}", "--proxy-set", PINNED,
            # the model's own end-of-turn ids: a random policy's completions may all run into max_tokens
            f"--process-opt=--tokenizer={ROOT / '.cache' / 'models' / 'tiny'}"]


@pytest.fixture(scope="session")
def dev_server():
    from tests.support.dev_server import shared

    return shared()  # one server for tests/trainer and tests/integrations (tests/support/dev_server.py)


@pytest.fixture(scope="session")
def exact_rollout(dev_server, tmp_path_factory) -> Path:
    if not POLAR_ROLLOUT.exists():
        pytest.fail(f"{POLAR_ROLLOUT} is missing: run scripts/setup", pytrace=False)
    run = tmp_path_factory.mktemp("exact") / "run"
    proc = rollout(*exact_rollout_args(dev_server.base_url, run))
    assert proc.returncode == 0, f"polar-rollout failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert (run / "out" / "sequences.parquet").is_file(), proc.stdout[-3000:]
    return run
