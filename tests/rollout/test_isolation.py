"""Isolation through the runner (issue 15, docs/architecture.md#the-rollout-runner): one polar-rollout run per sandbox
kind (bwrap; docker when the dockerd fixture starts), K = 2, with the probe agent (tests/rollout/probeagent.py) trying
every way out from inside its sandbox. Asserted from what the verifier copied to
RUN/samples/probe/<k>/0/verifier/probe.json, the scripted upstream's requests and RUN/flows:

- the repository, certs/, .cache/run/, RUN/, examples/tasks/*/solution (and the task's own solution/ and tests/) by
  their absolute host paths: not there at all (ENOENT, not just unreadable);
- the other sample's workdir and HOME (its marker files, by host path, while it runs): not there; no host process and
  no mount of the other sample is visible;
- direct connections: every loopback port but the relay's own 18080 refused (all 65535 tried), the host's addresses
  unreachable, a listener on the host's every address sees no connection, the Docker socket is not there;
- through the proxy: a CONNECT to a non-provider host (and to the vLLM port, and to a provider on port 80), plain HTTP
  to the vLLM port, to polar.gateway/admin/… and to a provider name on port 80 each get 403 and no backend request
  (the readiness probe, the one allowed plain-HTTP request, answers 200: the path to the proxy works);
- one real model call with another session in its proxy URL (sample 0 claims sample 1's real session, sample 1 another
  run's) is recorded under the sample's own session `<run-id>/probe/<k>/0`, and is the backend's only chat request;
  on that path, requests to provider hosts that are no model call (vLLM's /reset_prefix_cache, /sleep,
  /v1/load_lora_adapter, /metrics, …) get the gateway's 4xx and never reach the backend;
- what every sample shares (the venv, the agent folder, the Python installation, /usr, /etc, /run/polar) is read-only.

The same run again with the task in its own image (environment/Dockerfile FROM python:3.12-slim, the stand-in mapped
in; rollout/images/environments.py): bwrap over the exported root and docker over the image itself. There the sandbox
runtime (/run/polar/rt), the agent's modules and folder (/run/polar/lib, /run/polar/agent) and the image's own system
are what is shared and read-only, and the host's own programs (bwrap, dockerd, …) are not there at all.

The loopback scan counts `self-connect`s apart: an ephemeral port picked as its own source port connects a socket to
itself (TCP simultaneous open), with no listener behind it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from polar import records as rec
from polar.rollout.sandbox import base as sandbox
from polar.rollout.sandbox.control import CONTROL
from polar.rollout import specs as agentcmd
from polar.rollout.images.runtime import INSIDE as RUNTIME
from tests.rollout.rollout_support import HERE, explain, make_task, results, rollout, rollout_env
from tests.support.need import need_sandbox
from tests.support.scripted_upstream import Reply

pytestmark = pytest.mark.integration

# How long the two samples may take to be in their model call at once (sandbox starts differ; a loaded machine): a
# deadline that only turns a sample that never arrives into a failure, well inside the 120 s agent timeout
RENDEZVOUS_DEADLINE_S = 90.0
REPO = Path(__file__).resolve().parents[2]  # the repository (scripts/, certs/, .cache/, .venv)
TASK = "probe"
RUN_ID = "iso1"
RELAY_PORT = sandbox.RELAY_PORT
REFUSED_PROBES = ("connect_other_host", "connect_vllm", "connect_provider_80", "http_vllm", "http_vllm_chat",
                  "http_admin", "http_admin_post", "http_provider_80", "http_provider_80_get")
# Requests inside a provider's decrypted tunnel that are no model call: none may reach the backend (vLLM's own
# admin and non-chat endpoints)
BACKEND_ONLY = ("/reset_prefix_cache", "/sleep", "/wake_up", "/v1/load_lora_adapter", "/metrics", "/v1/embeddings",
                "/pooling", "/probe-path")
PROVIDER_PATHS = [["POST", "https://api.openai.com/reset_prefix_cache"], ["POST", "https://api.openai.com/sleep"],
                  ["POST", "https://api.openai.com/wake_up"], ["POST", "https://api.openai.com/v1/load_lora_adapter"],
                  ["GET", "https://api.openai.com/metrics"], ["POST", "https://api.openai.com/v1/embeddings"],
                  ["POST", "https://api.openai.com/pooling"], ["GET", "https://api.openai.com/v1/probe-path"],
                  ["POST", "https://api.openai.com/v1/chat/completions/../../reset_prefix_cache"],
                  ["POST", "https://api.anthropic.com/v1/../reset_prefix_cache"],
                  ["GET", "https://generativelanguage.googleapis.com/metrics"]]
# Shared by every sample, read-only inside: a file created (or appended to) there would reach the others and the host
WRITE_TARGETS = [f"{agentcmd.IN_VENV}/probe-write", f"{agentcmd.IN_VENV}/pyvenv.cfg", f"{agentcmd.IN_VENV}/bin/python",
                 f"{agentcmd.IN_AGENT_DIR}/probe-write", f"{agentcmd.IN_AGENT_DIR}/probeagent.py",
                 f"{agentcmd.IN_LIB}/polar/rollout/pyagent.py", f"{agentcmd.IN_LIB}/probe-write",
                 f"{CONTROL}/probe-write", f"{CONTROL}/relay.py", f"{sys.base_prefix}/probe-write",
                 "/usr/probe-write", "/etc/probe-write", "/etc/passwd", "/probe-write"]
# In a task's own image: the sandbox runtime, the agent's modules and folder, the control files — mounted from the
# host, never writable —, and the image's system: its root is the sample's own layer (rollout/sample.py
# _writable_root), where a new file lands in the layer and a file the image's root owns is not written in place
IMAGE_NEW_FILES = ["/usr/probe-write", "/etc/probe-write"]
# "/" itself stays root's: a docker layer has no entry for "/" (the committed image keeps its owner), and an overlay's
# root takes its owner from the upper layer's directory, which the runner makes — so a new file at the top is refused
IMAGE_TOP_FILE = "/probe-write"
IMAGE_OWNED_FILES = ["/usr/local/bin/python3", "/etc/passwd"]
IMAGE_WRITE_TARGETS = [f"{RUNTIME}/probe-write", f"{RUNTIME}/bin/python3", f"{RUNTIME}/venv/pyvenv.cfg",
                       f"{RUNTIME}/venv/lib/python3.12/site-packages/probe-write",
                       f"{agentcmd.IMAGE_LIB}/polar/rollout/pyagent.py", f"{agentcmd.IMAGE_LIB}/probe-write",
                       f"{agentcmd.IMAGE_AGENT_DIR}/probeagent.py", f"{agentcmd.IMAGE_AGENT_DIR}/probe-write",
                       f"{CONTROL}/probe-write", f"{CONTROL}/relay.py", *IMAGE_OWNED_FILES, *IMAGE_NEW_FILES,
                       IMAGE_TOP_FILE]
# The host's own programs, which no task image holds (those this host has)
HOST_ONLY = ("/usr/bin/bwrap", "/usr/bin/dockerd", "/usr/bin/mmdebstrap", "/usr/bin/patchelf", "/usr/bin/chromium")
IMAGE_DOCKERFILE = "FROM python:3.12-slim\nWORKDIR /app\nCOPY README.md /app/\n"
VERIFIER = """#!/usr/bin/env bash
APP=${POLAR_APP:-/app}
LOGS=${POLAR_LOGS:-/logs/verifier}
cp "$APP/probe.json" "$LOGS/probe.json" 2>/dev/null
if [ "$(cat "$APP/answer.txt" 2>/dev/null)" = 42 ]; then r=1.0; else r=0.0; fi
printf '{"reward": %s}\\n' "$r" > "$LOGS/reward.json"
"""


class Listener:
    """A TCP listener on every host address (dual-stack `::`, else `0.0.0.0`), counting the connections it accepts."""

    def __init__(self) -> None:
        try:
            self.sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            self.sock.bind(("::", 0))
        except OSError:  # no IPv6 on this host: every IPv4 address
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, addr = self.sock.accept()
            except OSError:
                return
            if not self._stop:
                self.accepted.append(addr)
            conn.close()

    def close(self) -> None:
        self._stop = True
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()  # wake accept()
        except OSError:
            pass
        self.sock.close()
        self._thread.join(timeout=5)


def _host_ips() -> list[str]:
    """The host's own addresses (loopback and every interface's), IPv4 and IPv6."""
    ips = ["127.0.0.1", "::1"]
    ip = shutil.which("ip")
    if ip:
        out = subprocess.run([ip, "-o", "addr"], check=False, capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[2] in ("inet", "inet6"):
                addr = parts[3].split("/")[0]
                if not addr.startswith("fe80") and addr not in ips:
                    ips.append(addr)
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route's source address is chosen
            if s.getsockname()[0] not in ips:
                ips.append(s.getsockname()[0])
        except OSError:
            pass
        finally:
            s.close()
    return ips


def _host_paths(tasks: Path, run: Path, tmp_path: Path) -> list[str]:
    root = REPO
    paths = [root, root / "README.md", root / "pyproject.toml", root / "rollout" / "runner.py", root / ".git",
             root / "certs", *sorted((root / "certs").glob("*")), root / ".cache", root / ".cache" / "run",
             *sorted((root / ".cache" / "run").glob("*"))[:10], root / "flows", root / ".venv" / "pyvenv.cfg",
             *sorted((root / "examples" / "tasks").glob("*/solution")),
             *sorted((root / "examples" / "tasks").glob("*/solution/*")),
             tmp_path, tasks / TASK / "solution" / "solve.sh", tasks / TASK / "tests" / "test.sh",
             tasks / TASK / "task.toml"]
    existing = [str(p) for p in paths if os.path.lexists(p)]
    # RUN's own files, created by the run before any sample starts
    existing += [str(run), str(run / "run.json"), str(run / "flows"), str(run / "samples"), str(run / ".work")]
    return existing


def _work(run: Path, k: int) -> Path:
    return run / ".work" / f"{TASK}-{k}-0"


def _probe_task(tasks: Path, run: Path, tmp_path: Path, upstream, listener: Listener, unix_sockets: list[str],
                image: bool = False) -> Path:
    task = make_task(tasks, TASK, "probe")
    paths, writes = _host_paths(tasks, run, tmp_path), WRITE_TARGETS
    if image:  # the same start state, as a published task builds it
        shutil.move(task / "environment" / "workdir" / "README.md", task / "environment" / "README.md")
        (task / "environment" / "workdir").rmdir()
        (task / "environment" / "Dockerfile").write_text(IMAGE_DOCKERFILE)
        paths += [p for p in HOST_ONLY if os.path.lexists(p)]
        writes = IMAGE_WRITE_TARGETS
    (task / "tests" / "test.sh").write_text(VERIFIER)
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/sh\necho 42 > answer.txt\n")
    shutil.copyfile(HERE / "probeagent.py", task / "agent" / "probeagent.py")
    other = {str(k): [str(_work(run, 1 - k) / "app"), str(_work(run, 1 - k) / "app" / "marker.txt"),
                      str(_work(run, 1 - k) / "home"), str(_work(run, 1 - k) / "home" / "marker.txt"),
                      str(_work(run, k) / "app" / "marker.txt")]  # its own, by host path, is not there either
             for k in (0, 1)}
    cfg = {"paths": paths, "other_sample_paths": other, "host_ips": _host_ips(),
           "host_ports": [listener.port, upstream.port], "unix_sockets": unix_sockets,
           "upstream_port": upstream.port, "provider_paths": PROVIDER_PATHS, "write_targets": writes,
           "full_scan": 0, "model_call_timeout_s": RENDEZVOUS_DEADLINE_S + 10,
           # sample 0 claims sample 1's real session, sample 1 another run's
           "spoofed_session": {"0": f"{RUN_ID}/{TASK}/1/0", "1": f"r-other/{TASK}/9/0"}}
    (task / "agent" / "probe_config.json").write_text(json.dumps(cfg, indent=1))
    return task


@pytest.fixture
def listener():
    lis = Listener()
    socket.create_connection(("127.0.0.1", lis.port), timeout=2).close()  # it works from the host
    for _ in range(50):
        if lis.accepted:
            break
        threading.Event().wait(0.02)
    assert lis.accepted, "the host-side listener does not accept"
    lis.accepted.clear()
    yield lis
    lis.close()


class Rendezvous(threading.Thread):
    """The moment both samples are provably running: each one's model call parked at the upstream's gate at once.
    `at` is that host time (None: never, by the deadline); then both calls go on."""

    def __init__(self, upstream, n: int = 2):
        super().__init__(daemon=True)
        self.upstream, self.n, self.at = upstream, n, None
        self.start()

    def run(self) -> None:
        up = self.upstream
        with up._gate_cond:
            met = up._gate_cond.wait_for(lambda: up._gate_waiting >= self.n, RENDEZVOUS_DEADLINE_S)
        if met:
            self.at = time.time()
        up.release(self.n)


@pytest.mark.parametrize("variant", ["bwrap", "docker", "bwrap-image", "docker-image"])
def test_isolation_from_inside_the_sandbox(variant, tmp_path, upstream, listener, request, monkeypatch):
    kind, image = variant.removesuffix("-image"), variant.endswith("-image")
    env, extra = rollout_env(), []
    unix_sockets = ["/var/run/docker.sock", "/run/docker.sock"]
    if kind == "bwrap":
        need_sandbox("bwrap")
    if kind == "docker" or image:  # an image is built in the private dockerd, whichever sandbox runs it
        host = request.getfixturevalue("dockerd")
        env = rollout_env(DOCKER_HOST=host)
        unix_sockets.append(host.removeprefix("unix://"))
    if image:
        request.getfixturevalue("cache_dir")  # this run's exports are removed after the session
        extra = ["--image-map", f"@{request.getfixturevalue('images')['map']}", "--build-network", "none"]
    tasks, run = tmp_path / "tasks", tmp_path / "run"
    _probe_task(tasks, run, tmp_path, upstream, listener, unix_sockets, image)
    monkeypatch.setattr(upstream, "gate_timeout", RENDEZVOUS_DEADLINE_S + 5)
    upstream.script(Reply(text="probe answer", gate=True), Reply(text="probe answer", gate=True))
    meet = Rendezvous(upstream)
    proc = rollout(str(tasks), "--agent", "python:probeagent:run", "--out", str(run), "--sandbox", kind,
                   "--upstream", upstream.base_url, "--samples", "2", "--parallel", "2", "--skip-preflight",
                   "--no-process", "--run-id", RUN_ID, "--agent-timeout", "120",
                   "--proxy-set", "polar_exact=false",  # exact mode's probe call would take a gated reply
                   *extra, env=env, timeout=240)
    assert proc.returncode == 0, explain(proc)
    doc = json.loads((run / "run.json").read_text())
    assert doc["isolation_safe"] is True and doc["proxy"]["other_hosts"] == "refuse"
    if image:  # the task ran in its own built image, not on the host's system
        env_doc = doc["environments"][TASK]
        assert env_doc["mode"] == "image" and env_doc["image_id"].startswith("sha256:") and env_doc["substituted"], env_doc
    lines = {line["k"]: line for line in results(run)}
    assert {k: (ln["status"], ln["reward"], ln["sandbox"]) for k, ln in lines.items()} == {
        0: ("completed", 1.0, kind), 1: ("completed", 1.0, kind)}, lines
    probes = {k: json.loads((run / "samples" / TASK / str(k) / "0" / "verifier" / "probe.json").read_text())
              for k in (0, 1)}
    cfg = json.loads((tasks / TASK / "agent" / "probe_config.json").read_text())

    for k, res in probes.items():
        assert res["k"] == k and res["session_env"] == f"{RUN_ID}/{TASK}/{k}/0" and res["uid"] == sandbox.UID
        # the host's files: not there at all
        visible = {p: why for p, why in res["paths"].items() if why != "ENOENT"}
        assert visible == {}, f"sample {k} sees host paths: {visible}"
        assert len(res["paths"]) >= 20 and any("/certs/" in p for p in res["paths"])
        assert any(p.endswith("/solution/solve.sh") and "/examples/" in p for p in res["paths"])
        # nothing shared is writable; in an image, new files in its root land in the sample's own layer
        sample = json.loads((run / "samples" / TASK / str(k) / "0" / "sample.json").read_text())
        own_layer = sample.get("root_view") in ("container", "overlay")
        assert sample.get("root_view") == (None if "image" not in variant else "container" if "docker" in variant
                                           else sample.get("root_view")), sample.get("root_view")
        shared = {t: why for t, why in res["writes"].items()
                  if not (own_layer and t in (*IMAGE_NEW_FILES, IMAGE_TOP_FILE))}
        assert all(why in ("EROFS", "EACCES", "EPERM") for why in shared.values()), res["writes"]
        if own_layer:
            assert {t: res["writes"][t] for t in IMAGE_NEW_FILES} == dict.fromkeys(IMAGE_NEW_FILES, "ok")
            assert {t: res["writes"][t] for t in IMAGE_OWNED_FILES} == dict.fromkeys(IMAGE_OWNED_FILES, "EACCES")
            assert res["writes"][IMAGE_TOP_FILE] == "EACCES", res["writes"]
        assert sorted(res["writes"]) == sorted(cfg["write_targets"])
        # the other sample: its workdir and HOME by host path, while it was running; its mounts; host processes
        assert set(res["other_sample"].values()) == {"ENOENT"}, res["other_sample"]
        other = lines[1 - k]
        assert meet.at is not None, "the two samples were never in their model call at once"
        assert other["t_start"] < meet.at < res["t_other"] < other["t_end"], "the samples did not overlap"
        assert f".work/{TASK}-{1 - k}-" not in res["mountinfo"]
        # only the sandbox's own processes (bwrap's pid 1, the relay wrapper, the agent); bwrap's own argv names
        # the host paths it binds, which is no access to them
        for cmdline in res["processes"]:
            assert f"{TASK}-{1 - k}-" not in cmdline, cmdline
            assert not any(w in cmdline for w in ("mitmdump", "polar.rollout.cli", "dockerd", "-m pytest")), cmdline
        assert len(res["processes"]) <= 4, res["processes"]
        # direct connections: nothing
        assert "ok" not in res["direct"].values(), res["direct"]
        assert set(res["unix"].values()) == {"ENOENT"}, res["unix"]
        # through the proxy: the readiness probe answers, everything else is 403 and never tunnelled
        assert res["proxy"]["ready"]["status"] == 200, res["proxy"]["ready"]
        for name in REFUSED_PROBES:
            got = res["proxy"][name]
            assert got["status"] == 403 and got["tunnel_reply"] is None, (name, got)
        assert res["model_call"] == {"ok": True, "content": "probe answer"}, res["model_call"]
        # inside a provider's decrypted tunnel, what is no model call is answered by the gateway, never forwarded
        assert sorted(res["provider_paths"]) == sorted(f"{m} {u}" for m, u in PROVIDER_PATHS), res["provider_paths"]
        assert all(isinstance(v, int) and 400 <= v < 500 for v in res["provider_paths"].values()), res["provider_paths"]
    assert probes[0]["loopback_open_ports"] == [RELAY_PORT], probes[0]["loopback_open_ports"]
    refused = dict(probes[0]["loopback_refused"])
    refused.pop("self-connect", None)  # an ephemeral port picked as its own source port: no listener
    assert refused == {"ECONNREFUSED": 65534 - probes[0]["loopback_refused"].get("self-connect", 0)}, refused
    assert listener.accepted == []
    assert not (REPO / ".venv" / "probe-write").exists()
    assert not (tasks / TASK / "agent" / "probe-write").exists()
    assert set(cfg["host_ips"]) >= {"127.0.0.1", "::1"}

    # the backend: only the two real calls, none of the refused probes
    assert [r.path for r in upstream.requests if "probe" in r.path] == []
    assert [r.path for r in upstream.requests if any(p in r.path for p in BACKEND_ONLY)] == []
    chats = upstream.chat_requests
    # the rest is the gateway's own metadata calls (model name, version, tokenizer, weight version), none carrying
    # a probe's query
    assert {r.path for r in upstream.requests} <= {"/v1/chat/completions", "/v1/models", "/version", "/tokenize",
                                                   "/v1/version", "/v1/tokenize", "/weight_info"}, [
        r.path for r in upstream.requests]
    assert len(chats) == 2, [r.path for r in upstream.requests]
    assert sorted(json.dumps(r.body["messages"]) for r in chats) == sorted(
        json.dumps([{"role": "user", "content": f"probe sample {k}"}]) for k in (0, 1))

    # the records: each call under the sample's own session, whatever its proxy URL said
    files = sorted(str(p) for p in (run / "flows").glob("*.msgpack"))
    records = [r for _, _, r in rec.iter_files(files)]
    assert Counter(r["session"] for r in records) == {f"{RUN_ID}/{TASK}/0/0": 1, f"{RUN_ID}/{TASK}/1/0": 1}
    for r in records:
        k = int(r["session"].split("/")[2])
        assert f"probe sample {k}" in repr(r["request"]), (r["session"], r["request"])  # the sample's own call
        assert r["session_source"] == "proxy_auth" and r["prompt_token_ids"]
