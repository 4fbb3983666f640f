"""polar-train against a pool of two dev-mode tiny replicas — the session's shared pool (float32; test_pool.py's),
given its original weights back at the end — killed twice where a kill hurts most, then resumed (issue 42). It lives
in the proxy's session to share that pool; polar-train runs as it runs for a user, from .venv-train:
1. killed inside step 1's publication, once the first replica serves step-0001 and the second still step-0000, the
   serve's proxy held (`POLAR_TRAIN_KILL_AT=pool-reload:1`);
2. resumed, and killed inside step 2's checkpoint write — the directory whole under its temporary name, not renamed
   (`checkpoint-write:2`);
3. resumed to the end.
Then: every step trained once (step 1's checkpoint is the one written before the first kill, published on resume,
never trained again; step 2's half-written directory is gone), both replicas serve the last version, the run's calls
went to both replicas, and each step's calls were served by the version published before it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.support.need import need
from tests.trainer.conftest import ANSWER_AGENT, ROOT, TRAIN_TASK

pytestmark = pytest.mark.vllm
TRAIN_PY = ROOT / ".venv-train" / "bin" / "python"
POLAR_TRAIN = [str(TRAIN_PY), "-m", "polar.trainer.train"]
TINY = ROOT / ".cache" / "models" / "tiny"
TIMEOUT = 900  # a generous bound for one polar-train process on a loaded 2-core machine (not a speed claim)


@pytest.fixture
def pool():
    from tests.support.vllm_server import shared_vllm_pool, shared_vllm_pool_run_file

    need(None if TRAIN_PY.exists() else f"{TRAIN_PY} is missing", setup="scripts/setup --train")
    urls = [s.base_url for s in shared_vllm_pool(2)]
    run_file = shared_vllm_pool_run_file(2)
    yield urls, run_file
    back = subprocess.run([sys.executable, str(ROOT / "scripts" / "vllm"), "reload", "--weights", str(TINY), "--version",
                           "base", "--run-file", run_file], capture_output=True, text=True, timeout=600)
    assert back.returncode == 0, back.stderr[-2000:]


def _lines(run: Path) -> list[dict]:
    path = run / "train.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _files(ckpt: Path) -> dict[str, tuple[int, int]]:
    """Each file of a checkpoint: (inode, mtime ns) — the same file, not a rewrite of it."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in ckpt.iterdir()}


def _versions(urls: list[str]) -> list[str]:
    import httpx

    return [httpx.get(u.removesuffix("/v1") + "/weight_info", timeout=30).json()["weight_version"] for u in urls]


def _train(args: list[str], kill_at: str | None = None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("HTTPS_PROXY", "https_proxy", "POLAR_TRAIN_KILL_AT")}
    if kill_at:
        env["POLAR_TRAIN_KILL_AT"] = kill_at
    return subprocess.run([*POLAR_TRAIN, *args], capture_output=True, text=True, timeout=TIMEOUT, env=env,
                          stdin=subprocess.DEVNULL)


def test_killed_in_a_pool_reload_and_in_a_checkpoint_write(pool, tmp_path):
    urls, run_file = pool
    run = tmp_path / "run"
    first = _train([str(TRAIN_TASK), "--agent", ANSWER_AGENT, "--model", str(TINY), "--out", str(run), "--steps", "2",
                    "--samples", "4", "--lr", "1e-3", "--vllm-run-file", run_file, "--rollout-opt=--sandbox=none",
                    "--rollout-opt=--skip-preflight"], kill_at="pool-reload:1")
    assert first.returncode == -9, first.stderr[-3000:]
    assert _versions(urls) == ["step-0001", "step-0000"]  # killed between the two replicas
    assert _lines(run) == []
    ckpt1 = _files(run / "checkpoints" / "step-0001")

    second = _train(["--out", str(run), "--resume"], kill_at="checkpoint-write:2")
    assert second.returncode == -9, second.stderr[-3000:]
    assert "publishing step-0001" in second.stderr
    assert [ln["step"] for ln in _lines(run)] == [1]
    assert not (run / "checkpoints" / "step-0002").exists()
    assert list((run / "checkpoints").glob(".step-0002.tmp-*"))  # the write was cut short inside

    third = _train(["--out", str(run), "--resume"])
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-4000:]
    lines = _lines(run)
    assert [ln["step"] for ln in lines] == [1, 2] and all(ln["published"] for ln in lines)
    assert _files(run / "checkpoints" / "step-0001") == ckpt1  # step 1 never trained or written again
    assert not list((run / "checkpoints").glob(".*.tmp-*"))
    assert _versions(urls) == ["step-0002", "step-0002"]
    used = set()
    for step, served_by in ((1, "step-0000"), (2, "step-0001")):
        calls = pl.read_parquet(Path(run) / "steps" / f"{step:04d}" / "out" / "calls.parquet")
        assert set(calls["weight_version"].to_list()) == {served_by}, (step, calls["weight_version"].to_list())
        used |= set(calls["replica"].to_list())
    assert used == set(urls)  # sessions spread over both replicas (rendezvous on the run's session ids)
    report = json.loads((run / "train.json").read_text())
    assert report["vllm_run_file"] == str(Path(run_file).resolve())
