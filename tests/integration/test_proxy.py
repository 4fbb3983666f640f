"""The proxy as a process: real mitmdump, real TLS. What gets decrypted, fail-closed behaviour, CA files, binding,
and scripts/proxy start itself (readiness, a second start, the printed session)."""

from __future__ import annotations

import http.server
import json
import os
import shlex
import ssl
import stat
import subprocess
import threading

import httpx
import pytest

from tests.support.gateway import PROXY, ROOT, proxy_client, start_gateway
from tests.support.sentinel import Sentinel
from tests.support.servers import free_port, wait_for
from tests.support.tls import polar_import_blocker

pytestmark = pytest.mark.integration


@pytest.fixture
def tls_server(tmp_path):
    """A local HTTPS server with its own certificate, answering every request with 'own-server'."""
    server = Sentinel(str(tmp_path), "localhost", b"own-server")
    yield server.port, server.cert
    server.close()


def test_1_1_non_provider_tls_is_not_decrypted(gateway, tls_server):
    port, cert = tls_server
    # The client trusts ONLY the server's own certificate: this succeeds only if the proxy tunnels raw TCP.
    with httpx.Client(proxy=gateway.proxy_url(), verify=ssl.create_default_context(cafile=cert),
                      trust_env=False) as client:
        resp = client.get(f"https://localhost:{port}/")
    assert resp.text == "own-server"
    # And a client trusting only our CA fails on it: nobody minted a certificate for this host.
    with httpx.Client(proxy=gateway.proxy_url(), verify=gateway.ssl_context(), trust_env=False) as client:
        with pytest.raises(httpx.ConnectError):
            client.get(f"https://localhost:{port}/")
    assert gateway.records() == []


def test_1_2_provider_unknown_path_gets_a_fast_provider_404_and_no_record(gateway):
    with gateway.http_client() as client:
        resp = client.get("https://api.anthropic.com/v1/organizations/settings", headers={"x-api-key": "sk-x"})
    assert resp.status_code == 404 and resp.json()["type"] == "error"
    assert gateway.records() == []


def test_1_3_ca_files_are_private_and_proxy_binds_loopback(gateway):
    certs = os.path.join(ROOT, "certs")
    assert stat.S_IMODE(os.stat(certs).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(certs, "mitmproxy-ca.pem")).st_mode) == 0o600
    tracked = subprocess.run(["git", "ls-files", "certs"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert sorted(tracked) == ["certs/.gitignore", "certs/README.md"]
    assert gateway.state["listen_host"] == "127.0.0.1"
    assert listening_addresses(gateway.port) == ["127.0.0.1"]


def listening_addresses(port: int) -> list[str]:
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
    return sorted({line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()})


def test_1_4_without_listen_host_the_addon_binds_loopback(tmp_path, upstream):
    port = free_port()
    proc = subprocess.Popen([os.path.join(ROOT, ".venv", "bin", "mitmdump"), "-q", "-s",
                             os.path.join(ROOT, "addon", "polar_addon.py"), "--listen-port", str(port),
                             "--set", f"confdir={ROOT}/certs", "--set", f"polar_upstream={upstream.base_url}",
                             "--set", f"polar_flows={tmp_path}/flows"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # mitmdump may bind its default for a moment before the script has loaded (README: pass --listen-host to
        # avoid even that); once the addon runs, only loopback is left.
        wait_for(lambda: listening_addresses(port) == ["127.0.0.1"], timeout=30)
        assert listening_addresses(port) == ["127.0.0.1"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_2_1_package_import_failure_fails_closed(tmp_path, upstream):
    """With the polar package unimportable, provider requests get their own "unavailable" locally (Anthropic's is 529
    overloaded_error) and never reach the real host."""
    env = polar_import_blocker(tmp_path)
    with start_gateway(upstream.base_url, str(tmp_path / "run"), str(tmp_path / "flows"),
                       extra_args=["--allow-fail-closed"], env=env) as gw:
        with gw.http_client() as client:
            resp = client.post("https://api.anthropic.com/v1/messages", json={"model": "m"},
                               headers={"x-api-key": "sk-secret"})
        assert resp.status_code == 529 and resp.json()["error"]["type"] == "overloaded_error"
        assert "failed to load" in resp.text
        assert "failing closed" in gw.log_text()
        assert [r for r in upstream.requests if r.method != "GET"] == []  # scripts/proxy's check GETs /v1/models


# ---------------------------------------------------------------------------------------------- 3. scripts/proxy start


class ReadinessEndpoint:
    """An HTTP proxy that answers only the readiness probe: `not_ready` times 503 {"ready": false}, then ready."""

    def __init__(self, not_ready: int):
        self.answers: list[int] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                ready = len(outer.answers) >= not_ready
                body = json.dumps({"ready": ready, "upstream": "u", "pid": 1}).encode()
                outer.answers.append(200 if ready else 503)
                self.send_response(outer.answers[-1])
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_3_1_not_ready_answers_mean_wait():
    """The readiness race (issue 13 item 3): a bare 503 {"ready": false} is a start-up in progress, not a failure."""
    from polar.launch import proxy
    endpoint = ReadinessEndpoint(not_ready=4)

    class Running:
        def poll(self):
            return None

    try:
        infos = proxy.wait_ready([Running()], [endpoint.port], timeout=30)
    finally:
        endpoint.close()
    assert infos == [{"ready": True, "upstream": "u", "pid": 1}]
    assert endpoint.answers == [503, 503, 503, 503, 200]


# Holds the gateway's endpoint start (its `running` hook) until the probe has been answered not-ready N times: the
# window in which scripts/proxy used to give up, made wide and deterministic.
LATE_ENDPOINT = '''
import sys
if sys.argv and sys.argv[0].endswith("mitmdump"):
    import asyncio
    from polar.addon import endpoint, readiness

    N = 3
    _state = {"not_ready": 0, "go": None}
    _start, _request = endpoint.Endpoint.start, readiness.Readiness.request

    def request(self, flow):
        _request(self, flow)
        if flow.request.pretty_host == "polar.gateway" and flow.response and flow.response.status_code == 503:
            _state["not_ready"] += 1
            if _state["not_ready"] >= N and _state["go"] is not None:
                _state["go"].set()

    async def start(self, *args, **kwargs):
        if _state["not_ready"] < N:
            _state["go"] = asyncio.Event()
            await _state["go"].wait()
        print(f"late-endpoint: starting after {_state['not_ready']} not-ready answers", file=sys.stderr, flush=True)
        return await _start(self, *args, **kwargs)

    endpoint.Endpoint.start = start
    readiness.Readiness.request = request
'''


def test_3_2_start_waits_for_a_late_endpoint(tmp_path):
    """A real late start, through scripts/proxy start. Also: a stale run file (its pid is dead) does not block, and
    an upstream that does not answer is one warning line, not an error (vLLM may still be loading)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(LATE_ENDPOINT)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (run_dir / "proxy.json").write_text(json.dumps({"pid": gone.pid, "port": 1, "proxies": [{"pid": gone.pid,
                                                                                             "port": 1}]}))
    silent = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    proc = subprocess.run([*PROXY, "start", "--upstream", silent, "--flows", str(tmp_path / "flows"), "--run-dir",
                           str(run_dir), "--session", "s"], capture_output=True, text=True, timeout=90,
                          env=dict(os.environ, PYTHONPATH=str(hook)), check=False)
    try:
        assert proc.returncode == 0, proc.stderr
        warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning:")]
        assert len(warnings) == 1 and f"upstream {silent} does not answer" in warnings[0], proc.stderr
        state = json.loads((run_dir / "proxy.json").read_text())
        assert state["pid"] != gone.pid
        with open(state["log"], "rb") as fh:
            log = fh.read().decode("utf-8", "replace")
        assert "late-endpoint: starting after 3 not-ready answers" in log
    finally:
        subprocess.run([*PROXY, "stop", "--run-dir", str(run_dir)], capture_output=True, check=False)


def test_3_3_a_second_start_is_refused_and_the_session_is_escaped(tmp_path, upstream):
    """Issue 13 items 6 and 7: `--session` with `@` and `:` reaches the record unchanged; a second start on the same
    run dir would orphan the first proxy (stop reaches only the run file's pids), so it is refused."""
    run_dir = str(tmp_path / "run")
    session = "alice@lab:1"
    with start_gateway(upstream.base_url, run_dir, str(tmp_path / "flows"), extra_args=["--session", session]) as gw:
        again = subprocess.run([*PROXY, "start", "--upstream", upstream.base_url, "--run-dir", run_dir],
                               capture_output=True, text=True, timeout=60, check=False)
        assert again.returncode == 2, again.stderr
        assert again.stderr.startswith("error: a proxy already runs") and again.stderr.count("\n") == 1
        with open(os.path.join(run_dir, "proxy.json")) as fh:
            assert json.load(fh)["pid"] == gw.state["pid"]  # the run file still names the first proxy
        lines = subprocess.run([*PROXY, "env", "--session", session, "--run-dir", run_dir], capture_output=True,
                               text=True, check=True).stdout
        env = dict(shlex.split(line)[1].split("=", 1) for line in lines.splitlines())
        assert env["HTTPS_PROXY"] == f"http://alice%40lab%3A1:x@127.0.0.1:{gw.port}"
        with proxy_client(env["HTTPS_PROXY"], gw.ca_pem, timeout=60) as client:
            resp = client.post("https://api.openai.com/v1/chat/completions", headers={"authorization": "Bearer sk-x"},
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 200, resp.text
        assert [r["session"] for r in gw.records()] == [session]
    assert not os.path.exists(os.path.join(run_dir, "proxy.json"))  # stop reached the first proxy


def test_3_4_an_option_only_the_proxy_can_refuse_is_one_line_and_exit_2(tmp_path):
    """Issue 22: a value that parses but cannot work (a token file that cannot be created) is refused by the gateway
    at start-up, where mitmdump exits: start prints the gateway's line, not the log's CancelledError traceback."""
    run_dir = tmp_path / "run"
    proc = subprocess.run([*PROXY, "start", "--upstream", f"http://127.0.0.1:{free_port()}/v1", "--flows",
                           str(tmp_path / "flows"), "--run-dir", str(run_dir), "--set",
                           "polar_control_token=/dev/null/token"], capture_output=True, text=True, timeout=90,
                          check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: polar_control_token: cannot create or read the token file /dev/null/token")
    assert "Traceback" not in proc.stderr and not (run_dir / "proxy.json").exists()
    (log,) = run_dir.glob("proxy-*.log")
    text = log.read_text()
    assert "the proxy exits (a bad option at start-up)" in text and "CancelledError" not in text
