"""polar.launch.proxy and the CA: what a wheel install needs is named (the confdir), a new confdir gets one CA made
0700 with its key 0600, the CA bundle has one name per content, the env lines of proxy K; and `polar-proxy`, the
console script, starting, reporting and stopping a real proxy on a new confdir (integration)."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys

import pytest

from polar.launch import ca, paths
from polar.launch import proxy as lp
from polar.launch.process import alive
from polar.launch.runfiles import ProxyEntry, ProxyRunFile
from tests.support.records import flow_records
from tests.support.scripted_upstream import Reply

CONSOLE = os.path.join(os.path.dirname(sys.executable), "polar-proxy")


@pytest.fixture
def no_checkout(monkeypatch):
    monkeypatch.setattr(paths, "checkout_root", lambda: None)
    for var in ("POLAR_CONFDIR", "POLAR_RUN_DIR", "POLAR_NPM_DIR"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.unit
def test_1_1_outside_a_checkout_the_ca_lives_in_the_user_data_dir(no_checkout, monkeypatch, tmp_path):
    """Issue 37: --confdir, else $POLAR_CONFDIR, else a checkout's certs/, else $XDG_DATA_HOME/polar, else
    ~/.local/share/polar — made 0700 with its CA by the first proxy (ca.ensure_ca), as mitmproxy keeps ~/.mitmproxy."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert lp.resolve_confdir() == tmp_path / "home" / ".local" / "share" / "polar"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the XDG spec: a relative path is ignored
    assert lp.resolve_confdir() == tmp_path / "home" / ".local" / "share" / "polar"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert lp.resolve_confdir() == tmp_path / "data" / "polar"
    monkeypatch.setenv("POLAR_CONFDIR", str(tmp_path / "certs"))
    assert lp.resolve_confdir() == tmp_path / "certs"
    assert lp.resolve_confdir(str(tmp_path / "flag")) == tmp_path / "flag"  # the flag wins
    monkeypatch.delenv("POLAR_CONFDIR")
    assert ca.ensure_ca(str(lp.resolve_confdir())) is True
    assert stat.S_IMODE(os.stat(tmp_path / "data" / "polar").st_mode) == 0o700
    assert paths.npm_dir() is None and "--npm-dir" in paths.missing("npm_dir")
    assert lp.command() == "polar-proxy"


@pytest.mark.unit
def test_1_1b_in_a_checkout_the_ca_is_its_certs(monkeypatch):
    monkeypatch.delenv("POLAR_CONFDIR", raising=False)
    root = paths.checkout_root()
    assert root is not None and lp.resolve_confdir() == (root / "certs").resolve()


@pytest.mark.unit
def test_1_2_the_addon_and_mitmdump_are_the_installed_ones():
    script = lp.addon_script()
    import polar.addon

    assert os.path.dirname(script) == os.path.dirname(polar.addon.__file__) and script.endswith("polar_addon.py")
    assert lp.find_mitmdump() == os.path.join(os.path.dirname(sys.executable), "mitmdump")
    with pytest.raises(lp.ProxyError, match="--mitmdump /nonexistent") as exc:
        lp.find_mitmdump("/nonexistent")
    assert exc.value.code == 2


@pytest.mark.unit
def test_1_3_a_new_confdir_gets_one_private_ca(tmp_path):
    confdir = str(tmp_path / "certs")
    assert ca.ensure_ca(confdir) is True
    assert stat.S_IMODE(os.stat(confdir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(confdir, "mitmproxy-ca.pem")).st_mode) == 0o600
    with open(ca.ca_cert(confdir), "rb") as fh:
        cert = fh.read()
    os.chmod(confdir, 0o755)  # loosened by someone: tightened again, the CA kept
    assert ca.ensure_ca(confdir) is False
    assert stat.S_IMODE(os.stat(confdir).st_mode) == 0o700
    with open(ca.ca_cert(confdir), "rb") as fh:
        assert fh.read() == cert


@pytest.mark.unit
def test_1_4_the_bundle_is_one_file_per_content(tmp_path):
    ours, other = tmp_path / "ours.pem", tmp_path / "other.pem"
    ours.write_text("-----BEGIN CERTIFICATE-----\nours\n-----END CERTIFICATE-----\n")
    other.write_text("-----BEGIN CERTIFICATE-----\nother\n-----END CERTIFICATE-----\n")
    out = tmp_path / "run"
    first = ca.bundle(str(ours), str(out))
    assert os.path.basename(first).startswith("ca-bundle-") and first.endswith(".pem")
    with open(first, "rb") as fh:
        data = fh.read()
    assert data.endswith(ours.read_bytes()) and data == ca.bundle_bytes(str(ours))
    mtime = os.stat(first).st_mtime_ns
    assert ca.bundle(str(ours), str(out)) == first and os.stat(first).st_mtime_ns == mtime  # not written again
    assert ca.bundle(str(other), str(out)) != first  # another CA never overwrites a bundle an agent may use
    assert sorted(p.name for p in out.iterdir()) == sorted({os.path.basename(first),
                                                            os.path.basename(ca.bundle(str(other), str(out)))})


@pytest.mark.unit
def test_1_5_env_lines_for_proxy_k_of_a_fleet():
    state = ProxyRunFile(proxies=(ProxyEntry(pid=1, port=4001), ProxyEntry(pid=2, port=4002)), ca_pem="/c/ca.pem",
                         ca_bundle="/r/ca-bundle-x.pem")
    env = dict(shlex.split(line)[1].split("=", 1) for line in lp.env_lines(state, "a/b", proxy=1))
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://a%2Fb:x@127.0.0.1:4002"
    assert env["NODE_EXTRA_CA_CERTS"] == env["CODEX_CA_CERTIFICATE"] == "/c/ca.pem"
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == "/r/ca-bundle-x.pem"


@pytest.mark.integration
def test_2_1_polar_proxy_starts_reports_and_stops_a_proxy_on_a_new_confdir(tmp_path, upstream):
    if not os.path.isfile(CONSOLE):
        pytest.fail(f"{CONSOLE} is missing: reinstall the project (scripts/setup, or pip install -e .)")
    run_dir, confdir = tmp_path / "run", tmp_path / "certs"
    env = {k: v for k, v in os.environ.items() if k not in ("POLAR_RUN_DIR", "POLAR_CONFDIR")}

    def polar_proxy(*args, check=True):
        proc = subprocess.run([CONSOLE, *args, "--run-dir", str(run_dir)], capture_output=True, text=True,
                              timeout=90, env=env)
        assert not check or proc.returncode == 0, proc.stderr
        return proc

    started = polar_proxy("start", "--upstream", upstream.base_url, "--flows", str(tmp_path / "flows"),
                          "--confdir", str(confdir), "--session", "s1")
    try:
        assert f"a new CA in {confdir}" in started.stderr
        assert stat.S_IMODE(os.stat(confdir).st_mode) == 0o700
        state = ProxyRunFile.read(paths.proxy_run_file(run_dir))
        assert state.ca_pem == ca.ca_cert(str(confdir)) and state.confdir == str(confdir)
        assert os.path.dirname(state.ca_bundle) == str(run_dir) and state.first.control_url
        lines = dict(shlex.split(line)[1].split("=", 1) for line in started.stdout.splitlines())
        assert lines["HTTPS_PROXY"] == f"http://s1:x@127.0.0.1:{state.port}"
        status = polar_proxy("status")
        doc = json.loads(status.stdout)
        assert [(p["pid"], p["running"], p["ready"]) for p in doc["proxies"]] == [(state.pid, True, True)]
        # env --base-url: the lines an SDK needs to reach the gateway by base URL, used by a fresh shell whose
        # HTTPS_PROXY points nowhere (the `unset` line must take it away)
        based = polar_proxy("env", "--base-url", "--session", "s/2")
        exports = {k: v for line in based.stdout.splitlines() if line.startswith("export ")
                   for k, v in (word.split("=", 1) for word in shlex.split(line)[1:])}
        origin = f"http://127.0.0.1:{state.port}/s/s%2F2"
        assert exports == {"ANTHROPIC_BASE_URL": f"{origin}/anthropic", "OPENAI_BASE_URL": f"{origin}/openai/v1",
                           "GOOGLE_GEMINI_BASE_URL": f"{origin}/google", "NO_PROXY": "127.0.0.1,localhost,::1",
                           "no_proxy": "127.0.0.1,localhost,::1"}
        assert "unset HTTPS_PROXY https_proxy" in based.stdout.splitlines()
        upstream.script(Reply(text="by base url"))
        call = ("import openai; print(openai.OpenAI(api_key='sk-polar-dummy', max_retries=0).chat.completions"
                ".create(model='m', messages=[{'role': 'user', 'content': 'hi'}]).choices[0].message.content)")
        used = subprocess.run(["bash", "-c", f'eval "$LINES"; exec {sys.executable} -c "$CALL"'], text=True,
                              capture_output=True, timeout=60,
                              env={**env, "LINES": based.stdout, "CALL": call, "HTTPS_PROXY": "http://127.0.0.1:9",
                                   "https_proxy": "http://127.0.0.1:9"})
        assert used.returncode == 0 and used.stdout.strip() == "by base url", used.stderr[-2000:]
        [record] = flow_records(str(tmp_path / "flows"))
        assert (record["session"], record["session_source"], record["connect"]) == ("s/2", "path", "base_url")
    finally:
        stopped = polar_proxy("stop")
    assert f"stopped proxy pid {state.pid} on port {state.port}" in stopped.stderr
    assert not alive(state.pid) and not paths.proxy_run_file(run_dir).exists()
    after = polar_proxy("status", check=False)
    assert after.returncode == 1 and "no proxy running" in after.stderr
