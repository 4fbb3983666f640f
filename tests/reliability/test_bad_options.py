"""Every addon option set to a bad value, in turn, on a real mitmdump: the only outcomes are (a) mitmdump exits with one
line naming the option and what it expects, or (b) the proxy stays up failing closed (providers get their 503, the
readiness probe names the error). Either way the stand-in provider receives nothing — issue 13's fail-open hole was
`--set polar_exact=yes`, which loaded no addon at all, so the proxy forwarded the agent's request with its key.

Scenarios: 1.x each option with a bad value · 2.x the same through the fail-closed addon (package broken).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from polar.addon.options import OPTIONS
from tests.support.gateway import ROOT
from tests.support.mitmdump_zygote import Zygote
from tests.support.sentinel import Sentinel, tunnel
from tests.support.servers import free_port, probe_ready
from tests.support.tls import polar_import_blocker

pytestmark = pytest.mark.integration

MITMDUMP = os.path.join(ROOT, ".venv", "bin", "mitmdump")
CA_PEM = os.path.join(ROOT, "certs", "mitmproxy-ca-cert.pem")

# One bad value per option (several for the riskiest types); each `--set` list is applied as given.
BAD_VALUES: list[tuple[str, list[str]]] = [
    ("polar_upstream", ["polar_upstream=http://127.0.0.1:9"]),
    ("polar_upstream", ["polar_upstream=127.0.0.1:9/v1"]),
    ("polar_flows", ["polar_flows=/dev/null/flows"]),
    ("polar_model", ["polar_model="]),
    ("polar_hosts", ["polar_hosts=api.anthropic.com:99999"]),
    ("polar_backend", ["polar_backend=vlm"]),
    ("polar_upstream_api_key", ["polar_upstream_api_key=two words"]),
    ("polar_connect_timeout", ["polar_connect_timeout=ten"]),
    ("polar_first_byte_timeout", ["polar_first_byte_timeout=-1"]),
    ("polar_idle_timeout", ["polar_idle_timeout=0"]),
    ("polar_max_body_mb", ["polar_max_body_mb=nan"]),
    ("polar_rotate_mb", ["polar_rotate_mb=1e999"]),
    ("polar_min_free_mb", ["polar_min_free_mb=-5"]),
    ("polar_logprobs_mode", ["polar_logprobs_mode=raw"]),
    ("polar_thinking_kwarg", ["polar_thinking_kwarg=enable thinking"]),
    ("polar_sampling_override", ["polar_sampling_override=max_tokens=5"]),
    ("polar_sampling_override", ["polar_sampling_override=temperature=hot"]),
    ("polar_exact", ["polar_exact=yes"]),
    ("polar_exact", ["polar_exact=maybe"]),
    ("polar_exact", ["polar_exact=true", "polar_exact=false"]),  # given twice: mitmproxy's parser refuses it
    ("polar_exact_cache_mb", ["polar_exact_cache_mb=lots"]),
    ("polar_divert", ["polar_divert=maybe"]),
    ("polar_other_hosts", ["polar_other_hosts=block"]),
    ("polar_base_url", ["polar_base_url=yes"]),
    ("polar_control_token", ["polar_control_token="]),
    ("polar_control_token", ["polar_control_token=/dev/null/control-token"]),  # cannot be created
    ("polar_hold_timeout", ["polar_hold_timeout=soon"]),
    ("polar_hold_timeout", ["polar_hold_timeout=0"]),
    ("polar_announce", ["polar_announce=http://example.invalid:8080/calls"]),  # off loopback: refused, never resolved
    ("polar_announce", ["polar_announce=127.0.0.1:8080"]),  # no scheme
    ("polar_announce_hold", ["polar_announce_hold=-1"]),
    ("polar_announce_hold", ["polar_announce_hold=soon"]),
    ("polar_upstream", ["polar_upstream=http://127.0.0.1:9/v1,127.0.0.1:10/v1"]),  # one bad replica of two
    ("polar_upstream", ["polar_upstream=http://127.0.0.1:9/v1,http://127.0.0.1:9/v1"]),  # listed twice
    ("polar_upstream", ["polar_upstream=@/dev/null/replicas.txt"]),
    ("polar_replica_policy", ["polar_replica_policy=random"]),
    ("polar_replica_max_inflight", ["polar_replica_max_inflight=1.5"]),
]


def test_1_0_the_table_covers_every_option():
    assert {name for name, _ in BAD_VALUES} == {o.name for o in OPTIONS}


def _argv(port: int, sets: list[str], sentinel: Sentinel, flows: str) -> list[str]:
    argv = ["-q", "--listen-host", "127.0.0.1", "--listen-port", str(port), "-s",
            os.path.join(ROOT, "addon", "polar_addon.py"), "--set", f"confdir={os.path.join(ROOT, 'certs')}",
            "--set", f"polar_flows={flows}", "--set", f"polar_hosts=api.anthropic.com:{sentinel.port}"]
    for item in sets:
        argv += ["--set", item]
    return argv


def _observe(port: int, sentinel: Sentinel, exited) -> tuple[dict | None, tuple | None]:
    """Wait until the proxy exits or our addon answers ready or failing closed (at most 20 s), then, if it is still up, send an agent's
    request with its key to the stand-in provider through it."""
    info = None
    deadline = time.time() + 20
    # "ready: false" without an error is the endpoint still starting (a slow machine shows it): wait on
    while not exited() and time.time() < deadline and (info is None or not (info.get("ready") or info.get("error"))):
        info = probe_ready(port)
        time.sleep(0.05)
    if exited():
        return info, None
    try:
        return info, tunnel(port, sentinel.port, "api.anthropic.com", CA_PEM, path="/v1/messages",
                            body=b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}',
                            headers={"authorization": "Bearer sk-ant-SECRET", "content-type": "application/json"})
    except OSError as exc:  # gone in between: an exit, judged by the caller
        return info, ("gone", repr(exc))


def run_in_zygote(zygote: Zygote, sets: list[str], sentinel: Sentinel, flows: str, log: str) -> dict:
    port = free_port()
    pid = zygote.start(_argv(port, sets, sentinel, flows), log)
    info, answer = _observe(port, sentinel, lambda: zygote.poll(pid) is not None)
    rc = zygote.stop(pid)
    with open(log) as fh:
        return {"rc": rc, "output": fh.read(), "info": info, "answer": answer}


def run_mitmdump(sets: list[str], sentinel: Sentinel, flows: str, env: dict) -> dict:
    """The same through the real console script (a fresh interpreter: needed where the import itself must fail)."""
    port = free_port()
    proc = subprocess.Popen([MITMDUMP, *_argv(port, sets, sentinel, flows)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    info, answer = _observe(port, sentinel, lambda: proc.poll() is not None)
    proc.terminate()
    out, _ = proc.communicate(timeout=15)
    return {"rc": proc.returncode, "output": out, "info": info, "answer": answer}


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory):
    s = Sentinel(str(tmp_path_factory.mktemp("provider")))
    yield s
    s.close()


def _judge(name: str, result: dict) -> None:
    lines = [line for line in result["output"].splitlines() if name in line]
    if result["answer"] is None or result["answer"][0] == "gone":  # (a) it exited
        assert result["rc"] not in (0, None), result
        assert len(lines) == 1, result["output"]
        # No traceback of ours (mitmproxy may log its own CancelledError when the probe connects during its exit).
        assert "/addon/" not in result["output"] and "RecursionError" not in result["output"], result["output"]
    else:  # (b) it stayed up: failing closed, saying why
        status, body = result["answer"]
        assert status in (503, 529) and b"overloaded_error" in body, result
        assert result["info"] and result["info"].get("fail_closed") and name in result["info"]["error"], result


def test_1_1_each_bad_option_exits_or_fails_closed_and_nothing_reaches_the_provider(zygote, sentinel, tmp_path):
    flows = str(tmp_path / "flows")
    before = sentinel.connections
    for i, (name, sets) in enumerate(BAD_VALUES):
        _judge(name, run_in_zygote(zygote, sets, sentinel, flows, str(tmp_path / f"{i}.log")))
    assert sentinel.connections == before, "a provider request reached the stand-in provider"


def test_1_2_the_control_a_good_configuration_answers_from_the_gateway_not_the_provider(zygote, sentinel, tmp_path):
    # The same harness with good values reaches the gateway: the outcomes above are the bad values' doing.
    result = run_in_zygote(zygote, ["polar_upstream=http://127.0.0.1:9/v1"], sentinel, str(tmp_path / "flows"),
                           str(tmp_path / "good.log"))
    assert result["info"] and result["info"]["ready"] is True, result
    status, body = result["answer"]
    assert status == 529 and b"overloaded_error" in body  # the backend (port 9) is down: the gateway says so


def test_2_1_the_fail_closed_addon_answers_in_the_providers_shape_too(sentinel, tmp_path):
    blocker = polar_import_blocker(str(tmp_path))
    before = sentinel.connections
    result = run_mitmdump(["polar_exact=yes"], sentinel, str(tmp_path / "flows"), env=blocker)
    assert result["info"] and result["info"]["fail_closed"] is True, result
    status, body = result["answer"]
    assert status == 529 and json.loads(body)["error"]["type"] == "overloaded_error"
    assert sentinel.connections == before


def test_3_1_a_new_confdir_is_made_0700_with_its_key_0600_and_the_change_logged(zygote, sentinel, tmp_path):
    confdir = tmp_path / "newconf"  # mitmproxy creates it 0755 (its key 0600)
    port = free_port()
    argv = _argv(port, ["polar_upstream=http://127.0.0.1:9/v1"], sentinel, str(tmp_path / "flows"))
    argv[argv.index(f"confdir={os.path.join(ROOT, 'certs')}")] = f"confdir={confdir}"
    log = str(tmp_path / "conf.log")
    pid = zygote.start([a for a in argv if a != "-q"], log)  # -q would hide the warning
    info, _ = _observe(port, sentinel, lambda: zygote.poll(pid) is not None)
    zygote.stop(pid)
    assert info and info["ready"] is True
    assert oct(os.stat(confdir).st_mode & 0o777) == "0o700"
    assert oct(os.stat(confdir / "mitmproxy-ca.pem").st_mode & 0o777) == "0o600"
    with open(log) as fh:
        assert f"{confdir} was 0755, made it 0700" in fh.read()
