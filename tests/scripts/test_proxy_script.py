"""scripts/proxy without a proxy (issue 13 items 3, 6, 7, 8): bad options fail up front in one line, `env` with no
proxy is one line, the printed lines are shell-quoted with the session percent-encoded, a run file whose pids are
dead (or no longer ours) is stale for start, env and stop, only a readiness answer naming an error is final, and
--help gives every option's default."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from urllib.parse import unquote, urlsplit

import pytest

from tests.support.gateway import PROXY

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def proxy():
    """The functions scripts/proxy (polar-proxy) prints with and waits on (polar.launch.proxy)."""
    from polar.launch import proxy as launch_proxy

    return launch_proxy


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize("option,needle", [
    (["--upstream", "http://127.0.0.1:8000"], "did you mean http://127.0.0.1:8000/v1?"),
    (["--upstream", "127.0.0.1:8000/v1"], "http(s) URL ending in /v1"),
    (["--count", "0"], "--count"),
    (["--port", "70000"], "--port"),
    (["--timeout", "0"], "--timeout"),
])
def test_1_1_a_bad_option_fails_before_anything_starts(tmp_path, option, needle):
    proc = subprocess.run([*PROXY, "start", "--run-dir", str(tmp_path), *option], capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 2 and needle in one_line_error(proc)
    assert os.listdir(tmp_path) == []  # nothing launched, no log, no run file


def test_1_2_env_without_a_running_proxy_is_one_line(tmp_path):
    proc = subprocess.run([*PROXY, "env", "--run-dir", str(tmp_path)], capture_output=True, text=True, timeout=30,
                          check=False)
    assert proc.returncode == 1 and "no proxy running" in one_line_error(proc)
    (tmp_path / "proxy.json").write_text(json.dumps({"pid": dead_pid(), "port": 1, "ca_pem": "c", "ca_bundle": "b"}))
    proc = subprocess.run([*PROXY, "env", "--run-dir", str(tmp_path)], capture_output=True, text=True, timeout=30,
                          check=False)
    assert proc.returncode == 1 and "is not running" in one_line_error(proc) and proc.stdout == ""


def test_1_3_lines_are_shell_quoted_and_the_session_percent_encoded(proxy):
    state = {"port": 4242, "ca_pem": "/tmp/my certs/ca.pem", "ca_bundle": "/tmp/it's/bundle.pem"}
    lines = proxy.env_lines(state, "alice@lab:1")
    env = dict(shlex.split(line)[1].split("=", 1) for line in lines)  # what `eval` sees
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://alice%40lab%3A1:x@127.0.0.1:4242"
    url = urlsplit(env["HTTPS_PROXY"])
    assert (unquote(url.username), url.password, url.hostname, url.port) == ("alice@lab:1", "x", "127.0.0.1", 4242)
    assert env["NODE_EXTRA_CA_CERTS"] == env["CODEX_CA_CERTIFICATE"] == "/tmp/my certs/ca.pem"
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == "/tmp/it's/bundle.pem"
    # Plain values stay as they were (scripts/demo greps the HTTPS_PROXY line).
    assert proxy.env_lines({**state, "ca_pem": "/a/b.pem"}, "demo")[0] == "export HTTPS_PROXY=http://demo:x@127.0.0.1:4242"


def test_1_4_a_run_file_whose_pids_are_dead_or_foreign_is_stale(proxy):
    assert proxy.live_proxies(None) == []
    # Dead, and alive but not a proxy of ours (a recycled pid: this pytest process).
    stale = {"pid": dead_pid(), "port": 1, "proxies": [{"pid": dead_pid(), "port": 1}, {"pid": os.getpid(), "port": 2}]}
    assert proxy.live_proxies(stale) == []


def test_1_5_stop_signals_only_its_own_live_proxies(tmp_path):
    """A stale run file's pid may belong to another process by now: stop must not signal it."""
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)  # its own process group, as a proxy's is
    try:
        (tmp_path / "proxy.json").write_text(json.dumps({"pid": other.pid, "port": 1, "proxies": [
            {"pid": other.pid, "port": 1}, {"pid": dead_pid(), "port": 2}]}))
        proc = subprocess.run([*PROXY, "stop", "--run-dir", str(tmp_path)], capture_output=True, text=True,
                              timeout=30, check=False)
        assert proc.returncode == 0 and proc.stderr.count("was not running") == 2, proc.stderr
        assert other.poll() is None and not (tmp_path / "proxy.json").exists()
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("answer,final", [
    ({"ready": True}, True),
    ({"ready": False, "upstream": "u", "pid": 1}, False),  # endpoint not started yet: wait
    ({"ready": False, "error": "polar gateway failed to load; failing closed", "reason": "Traceback"}, True),
    ({"ready": False, "error": "polar_idle_timeout: must be > 0", "fail_closed": True}, True),
    ({"ready": False, "fail_closed": True}, True),
])
def test_1_6_only_an_answer_naming_an_error_is_final(proxy, answer, final):
    class Running:
        def poll(self):
            return None

    answers = [answer] + [{"ready": True}] * 10
    got = proxy.wait_ready([Running()], [1], timeout=30, probe=lambda port: answers.pop(0))
    assert got == [answer if final else {"ready": True}]


def test_1_7_not_ready_at_the_deadline_or_exited_is_no_answer(proxy):
    class Proc:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    got = proxy.wait_ready([Proc(None), Proc(1)], [1, 2], timeout=0.3, probe=lambda port: {"ready": False})
    assert got == [None, None]


def test_1_8_help_describes_every_option_and_its_default(proxy):
    from polar.launch import proxy_cli

    parser = proxy_cli.build_parser()
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help, action.dest
        if action.option_strings:
            assert "default" in action.help, action.option_strings
    text = subprocess.run([*PROXY, "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert "ending in /v1" in text and "(default: 30.0)" in text


@pytest.mark.parametrize("item,line", [
    ("polar_exct=true", "error: unknown option polar_exct (did you mean polar_exact?)"),
    ("polar_exact=yes", "error: polar_exact: expected true or false (or the value omitted, meaning true), got 'yes'"),
])
def test_1_9_a_bad_polar_set_is_one_line_exit_2_before_anything_starts(tmp_path, item, line):
    """Issue 22: a typo used to start a proxy that said nothing; a value mitmproxy cannot parse, ~50 lines ending in
    CancelledError."""
    proc = subprocess.run([*PROXY, "start", "--run-dir", str(tmp_path), "--set", item], capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 2 and one_line_error(proc) == line
    assert os.listdir(tmp_path) == []
