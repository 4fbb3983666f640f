"""A real pool of tiny vLLM replicas (`scripts/vllm start --replicas 2`, tests/support/vllm_server.py's
`shared_vllm_pool`): both replicas answer with the same model, `status` lists both, `stop` stops both.

1.1  the shared pool serves one model on two ports; status and stop act on both (the pool is then forgotten, so a
     later caller in this process starts a new one)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from polar.launch.process import alive
from polar.launch.vllm import read_pool, read_run_file
from tests.support.vllm_server import (ROOT, SCRIPT, forget_shared_vllm_pool, shared_vllm_pool,
                                       shared_vllm_pool_run_file)

pytestmark = pytest.mark.vllm


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=180, cwd=ROOT)


def test_1_1_both_replicas_serve_the_same_model_and_status_and_stop_act_on_both():
    servers = shared_vllm_pool(2)
    run_file = shared_vllm_pool_run_file(2)
    assert len(servers) == 2 and len({s.base_url for s in servers}) == 2
    models = []
    for server in servers:
        with server.client() as client:
            cards = client.get(server.base_url + "/models").json()["data"]
        models.append(cards[0]["id"])
    assert models == [servers[0].model] * 2
    assert read_pool(run_file).base_url == ",".join(s.base_url for s in servers)

    p = run("status", "--run-file", run_file)
    doc = json.loads(p.stdout)
    assert p.returncode == 0, p.stderr
    assert [r["base_url"] for r in doc["replicas"]] == [s.base_url for s in servers]
    assert [r["healthy"] for r in doc["replicas"]] == [True, True]

    pids = [read_run_file(s.run_file).pid for s in servers]
    try:
        p = run("stop", "--run-file", run_file)
    finally:
        forget_shared_vllm_pool(2)
    assert p.returncode == 0 and p.stderr.count("stopping replica") == 2, p.stderr
    assert not any(alive(pid) for pid in pids)
    assert not os.path.exists(run_file) and not any(os.path.exists(s.run_file) for s in servers)
    assert run("status", "--run-file", run_file).returncode == 1
