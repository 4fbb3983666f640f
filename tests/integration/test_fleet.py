"""A fleet of proxies (issue 9 item 3): `scripts/proxy start --count 2` — both answer, one CA, records land in one
flow directory with per-process file names, `env --proxy K` points at proxy K, `stop` stops both."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from polar import records as rec
from polar.processor.cli import main as polar_process
from tests.support.gateway import PROXY, proxy_client, start_gateway
from tests.support.servers import pid_alive as alive  # a zombie is gone (its parent, scripts/proxy, has exited)
from tests.support.servers import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(tmp_path, upstream):
    run_dir, flows = str(tmp_path / "run"), str(tmp_path / "flows")
    with start_gateway(upstream.base_url, run_dir, flows, extra_args=["--count", "2"]) as handle:
        yield handle


def test_1_1_two_proxies_answer_and_record_into_one_directory(fleet, tmp_path):
    state = fleet.state
    proxies = state["proxies"]
    assert len(proxies) == 2 and len({p["port"] for p in proxies}) == 2 and len({p["pid"] for p in proxies}) == 2
    # Readers of the single-proxy run file still find proxy 0 at the top level.
    assert (state["pid"], state["port"]) == (proxies[0]["pid"], proxies[0]["port"])
    for k, p in enumerate(proxies):
        env = subprocess.run([*PROXY, "env", "--proxy", str(k), "--session", f"agent-{k}", "--run-dir",
                              fleet.run_dir], capture_output=True, text=True, check=True).stdout
        assert f"export HTTPS_PROXY=http://agent-{k}:x@127.0.0.1:{p['port']}" in env
        assert f"NODE_EXTRA_CA_CERTS={state['ca_pem']}" in env  # one CA for the whole fleet
        with proxy_client(f"http://agent-{k}:x@127.0.0.1:{p['port']}", fleet.ca_pem, timeout=60) as client:
            resp = client.post("https://api.openai.com/v1/chat/completions", headers={"authorization": "Bearer sk-x"},
                               json={"model": "gpt-x", "messages": [{"role": "user", "content": f"hello {k}"}]})
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["role"] == "assistant"
    subprocess.run([*PROXY, "stop", "--run-dir", fleet.run_dir], check=True, capture_output=True)
    assert wait_for(lambda: not any(alive(p["pid"]) for p in proxies), timeout=15)
    assert not os.path.exists(os.path.join(fleet.run_dir, "proxy.json"))
    names = sorted(os.listdir(fleet.flows_dir))
    assert names and all(n.endswith(rec.FILE_SUFFIX) for n in names)  # closed on a clean shutdown
    pids = {n.split("-")[3] for n in names}
    assert pids == {str(p["pid"]) for p in proxies}, names
    sessions = {}
    for name in names:
        for _, r in rec.iter_file(os.path.join(fleet.flows_dir, name)):
            sessions.setdefault(r["session"], set()).add(name.split("-")[3])
    assert set(sessions) == {"agent-0", "agent-1"}
    assert sessions["agent-0"] != sessions["agent-1"]  # each proxy wrote only its own files
    assert polar_process([fleet.flows_dir, "-o", str(tmp_path / "out"), "-q", "--mode", "per_request"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["counts"]["sessions"] == 2 and report["counts"]["calls"] == 2


def test_1_2_start_prints_how_to_spread_agents(tmp_path, upstream):
    run_dir = str(tmp_path / "run")
    proc = subprocess.run([*PROXY, "start", "--count", "2", "--upstream", upstream.base_url, "--flows",
                           str(tmp_path / "flows"), "--run-dir", run_dir, "--session", "s"],
                          capture_output=True, text=True, timeout=90)
    try:
        assert proc.returncode == 0, proc.stderr
        assert "2 proxies on ports" in proc.stderr and "env --proxy $((i % 2))" in proc.stderr
        assert proc.stdout.count("export HTTPS_PROXY=") == 1
        bad = subprocess.run([*PROXY, "env", "--proxy", "2", "--run-dir", run_dir], capture_output=True, text=True)
        assert bad.returncode == 2 and "proxies 0…1" in bad.stderr
    finally:
        subprocess.run([*PROXY, "stop", "--run-dir", run_dir], capture_output=True)
