"""The rollout sandboxes (rollout/sandbox/run.py, rollout/sandbox/relay.py), for real: bwrap, docker (a private dockerd, see
conftest.py) and none where it means something. What the agent is, what it can see, what it can reach, and that
identity, timeouts and memory limits hold."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest
from polar.rollout.sandbox import base as sb
from polar.rollout.sandbox import registry, view
from polar.rollout.sandbox.run import run_sandboxed
from polar.rollout.sandbox.cgroup import _Cgroup
from polar.rollout.sandbox.control import CONTROL_PREFIX, OWNER_FILE, SANDBOX_VAR, _start_ticks, sweep_stale_controls
from polar.rollout.sandbox.relay import HeadError, HostRelay, basic_auth, rewrite_head
from tests.support.need import BASE, SYSTEM, need

ROOT = Path(__file__).resolve().parents[2]
ISOLATED = ("bwrap", "docker")
IN_VENV = "/opt/polar/venv"  # as rollout/runner.py mounts it
VENV = ROOT / ".venv"
# the sandbox timeout of the timeout test: short, so that the test is; the assert bounds are orderings around it
TIMEOUT_TEST_S = 1.5
# a deadline, not a speed: how long a killed tree may take to leave /proc on a loaded 2-core machine (polled)
GONE_DEADLINE_S = 10.0


# ---------------------------------------------------------------------------------------------- helpers


@pytest.fixture(params=["bwrap", "docker", "none"])
def kind(request) -> str:
    return _kind(request, request.param)


@pytest.fixture(params=ISOLATED)
def isolated(request) -> str:
    return _kind(request, request.param)


def _kind(request, name: str) -> str:
    if name == "docker":
        request.getfixturevalue("dockerd")
    elif name == "bwrap":
        need(None if shutil.which("bwrap") else "bwrap is not on PATH", setup=SYSTEM)
    why = registry.available(name)
    if why:
        pytest.fail(f"{name} is installed but not usable: {why}")
    return name


class Sample:
    """One sample's directories under a RUN dir, the way the runner lays them out."""

    def __init__(self, run: Path, task: str = "task-a", k: int = 0):
        self.dir = run / "samples" / task / str(k) / "0"
        self.app = self.dir / "app"
        self.home = self.dir / "home"
        self.app.mkdir(parents=True)
        self.home.mkdir()
        (self.app / "main.py").write_text("print('hi')\n")
        (self.home / ".secret-state").write_text(f"state of {task}/{k}\n")
        self.session = f"run-1/{task}/{k}/0"

    def run(self, kind: str, argv: list[str], *, timeout: float = 30, **fields) -> tuple[sb.SandboxResult, str, str]:
        fields.setdefault("env", {"POLAR_SESSION": self.session})
        spec = sb.SandboxSpec(kind=kind, app=self.app, home=self.home, mounts=fields.pop("mounts", ()),
                              proxy_port=fields.pop("proxy_port", None), session=fields.pop("session", self.session),
                              memory_mb=fields.pop("memory_mb", None), cpus=fields.pop("cpus", None), **fields)
        out, err = self.dir / "agent.stdout", self.dir / "agent.stderr"
        result = run_sandboxed(spec, argv, stdout=out, stderr=err, timeout=timeout)
        return result, out.read_text(errors="replace"), err.read_text(errors="replace")


def py(code: str) -> list[str]:
    return [sb.SYSTEM_PYTHON, "-c", code]


PROBE = r"""
import json, os, sys
out = {}
for p in sys.argv[1:]:
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:  # non-blocking: a FIFO opened for reading would wait for a writer
            os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))
        out[p] = "readable"
    except OSError as e:
        out[p] = type(e).__name__
print(json.dumps(out))
"""


class FakeProxy:
    """A TCP server standing in for the Polar proxy: records every connection's bytes (head and whatever follows
    within a moment), answers 200, closes."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._done = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while not self._done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        data = b""
        conn.settimeout(5)
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            conn.settimeout(0.3)
            try:
                while chunk := conn.recv(65536):
                    data += chunk
            except OSError:
                pass
            self.received.append(data)
            if data.startswith(b"CONNECT"):
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\nfrom-proxy")
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nfrom-proxy")
        except OSError:
            pass
        finally:
            conn.close()

    def sessions(self) -> list[str]:
        """The proxy user name of every Proxy-Authorization header received, percent-decoded (as the addon does)."""
        out = []
        for data in self.received:
            for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"proxy-authorization":
                    scheme, _, token = value.strip().partition(b" ")
                    assert scheme == b"Basic"
                    out.append(unquote(base64.b64decode(token).decode().rpartition(":")[0]))
        return out

    def close(self):
        self._done.set()
        self.sock.close()


@pytest.fixture
def fake_proxy():
    p = FakeProxy()
    yield p
    p.close()


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run = tmp_path / "RUN"
    run.mkdir()
    (run / "run.json").write_text('{"run_id": "run-1"}\n')
    (run / "results.jsonl").write_text("")
    return run


def _free_port_listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def _host_ip() -> str | None:
    """A non-loopback address of this host, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            ip = s.getsockname()[0]
        return None if ip.startswith("127.") else ip
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------- unit: the host end


@pytest.mark.unit
def test_rewrite_head_replaces_every_proxy_authorization():
    auth = basic_auth("run-1/t/0/0")
    head = (b"CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n"
            b"proxy-authorization: Basic b3RoZXI6eA==\r\nPROXY-AUTHORIZATION: Basic ZXZpbDp4\r\n\r\n")
    new, method, body = rewrite_head(head, auth)
    assert method == "CONNECT" and body == 0
    lines = new.split(b"\r\n")
    assert [ln for ln in lines if ln.lower().startswith(b"proxy-authorization")] == [
        b"Proxy-Authorization: " + auth.encode()]
    assert base64.b64decode(auth.split()[1]) == b"run-1%2Ft%2F0%2F0:x"
    assert b"Connection: close" not in new  # a tunnel is left alone


@pytest.mark.unit
def test_rewrite_head_addresses_an_origin_form_request_to_the_proxy_itself():
    """--connect base-url: the agent's Host is the relay's address in the sandbox; the gateway requires its own."""
    head = (b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:18080\r\nhost: evil.example\r\n"
            b"Content-Length: 2\r\nProxy-Authorization: Basic ZXZpbDp4\r\n\r\n")
    new, method, body = rewrite_head(head, basic_auth("s"), b"127.0.0.1:4242")
    lines = new.split(b"\r\n")
    assert (method, body) == ("POST", 2)
    assert [ln for ln in lines if ln.lower().startswith(b"host:")] == [b"Host: 127.0.0.1:4242"]
    assert [ln for ln in lines if ln.lower().startswith(b"proxy-authorization")] == [
        b"Proxy-Authorization: " + basic_auth("s").encode()]
    # a proxy request (absolute-form) keeps its Host: it names the host it is for
    proxied, _, _ = rewrite_head(b"GET http://polar.gateway/ready HTTP/1.1\r\nHost: polar.gateway\r\n\r\n",
                                 basic_auth("s"), b"127.0.0.1:4242")
    assert b"Host: polar.gateway" in proxied and b"4242" not in proxied


@pytest.mark.unit
@pytest.mark.parametrize("head", [
    b"CONNECT a:443 HTTP/1.1\r\nHost: a\nProxy-Authorization: Basic eDp4\r\n\r\n",  # bare LF hides a header
    b"CONNECT a:443 HTTP/1.1\r\nX: y\r\n Proxy-Authorization: Basic eDp4\r\n\r\n",  # obs-fold
    b"CONNECT a:443 HTTP/1.1\r\nX\0: y\r\n\r\n",
    b"CONNECT a:443\r\n\r\n",
    b"GET http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET http://a/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"GET http://a/ HTTP/1.1\r\nProxy-Authorization : Basic eDp4\r\n\r\n",
], ids=["bare-lf", "obs-fold", "nul", "no-version", "chunked", "two-lengths", "space-before-colon"])
def test_rewrite_head_refuses_ambiguous_heads(head):
    with pytest.raises(HeadError):
        rewrite_head(head, basic_auth("s"))


@pytest.mark.unit
def test_host_relay_plain_http_forwards_one_request_only(tmp_path, fake_proxy):
    """A second request pipelined on the same connection, under another session, never reaches the proxy."""
    path = str(tmp_path / "proxy.sock")
    with HostRelay(path, fake_proxy.port, "run-1/task-a/0/0") as relay:
        c = socket.socket(socket.AF_UNIX)
        c.connect(path)
        c.sendall(b"POST http://api.anthropic.com/v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n"
                  b"Proxy-Authorization: Basic b3RoZXIlMkYxOng=\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\n"
                  b"abcGET http://api.anthropic.com/ HTTP/1.1\r\nProxy-Authorization: Basic ZXZpbDp4\r\n\r\n")
        reply = b""
        c.settimeout(5)
        while chunk := c.recv(65536):
            reply += chunk
        c.close()
        assert reply.endswith(b"from-proxy")
        assert relay.connections == 1
    assert len(fake_proxy.received) == 1
    head, _, rest = fake_proxy.received[0].partition(b"\r\n\r\n")
    assert rest == b"abc"
    assert b"Connection: close" in head.split(b"\r\n") and b"keep-alive" not in head
    assert fake_proxy.sessions() == ["run-1/task-a/0/0"]


def test_host_relay_leaves_the_process_umask_alone(tmp_path, fake_proxy, monkeypatch):
    """The umask is process-wide: a relay that changed it, even for a moment, made the /app, HOME or /logs/verifier
    another sample thread was creating at that moment 0600 (CI: `bwrap: Can't chdir to /app`, EACCES on HOME).
    The socket still ends up the owner's alone (0600)."""
    calls = []
    real = os.umask
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real(mask))
    path = str(tmp_path / "proxy.sock")
    with HostRelay(path, fake_proxy.port, "run-1/task-a/0/0"):
        assert (os.stat(path).st_mode & 0o777) == 0o600
    assert calls == []


def test_control_dir_opens_only_once_its_socket_is_private(run_dir, fake_proxy, monkeypatch):
    """While the relay's socket is bound (mode from the umask, before its chmod) the control directory is 0700."""
    seen = []
    real_bind = socket.socket.bind

    def bind(self, address):
        if isinstance(address, str):
            seen.append(os.stat(os.path.dirname(address)).st_mode & 0o777)
        return real_bind(self, address)

    monkeypatch.setattr(socket.socket, "bind", bind)
    spec = sb.SandboxSpec(kind="none", app=run_dir / "app", home=run_dir / "home", mounts=(), env={},
                          proxy_port=fake_proxy.port, session="run-1/task-a/0/0", memory_mb=None, cpus=None,
                          image=sb.DEFAULT_IMAGE, label=None)
    for d in (spec.app, spec.home):
        d.mkdir(parents=True, exist_ok=True)
    ctl = view.Control(spec, registry.get(spec.kind), None)
    try:
        assert seen == [0o700] and (os.stat(ctl.dir).st_mode & 0o777) == 0o755
    finally:
        ctl.close()


@pytest.mark.unit
def test_available_and_prefixes():
    assert registry.available("none") is None
    assert "unknown sandbox" in registry.available("chroot")
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/polar-docker.sock"}
    old = os.environ.get("DOCKER_HOST")
    os.environ.update(env)
    try:
        why = registry.available("docker")
    finally:
        os.environ.pop("DOCKER_HOST") if old is None else os.environ.__setitem__("DOCKER_HOST", old)
    assert why and why.count("\n") == 0 and ("dockerd" in why or "docker client" in why)
    need(None if (VENV / "bin" / "python").exists() else f"{VENV}/bin/python is missing", setup=BASE)
    real = Path(os.path.realpath(VENV / "bin" / "python")).parents[1]
    prefixes = view.python_prefixes([VENV])
    for p in prefixes:
        assert p not in ("/", "/root", str(Path.home())) and any((Path(p) / "bin").glob("python*"))
    if not str(real).startswith(("/usr/", "/bin/", "/lib")):
        assert prefixes == [str(real)]  # e.g. /root/.pyenv/versions/3.12.1, not /root


# ---------------------------------------------------------------------------------------------- who and where


def test_agent_is_uid_1000_in_app(kind, run_dir):
    s = Sample(run_dir)
    code = ("import os, json; st = open('/proc/self/status').read();"
            "caps = [l.split()[1] for l in st.splitlines() if l.startswith('CapEff')];"
            "nnp = [l.split()[1] for l in st.splitlines() if l.startswith('NoNewPrivs')];"
            "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'cwd': os.getcwd(), 'home': os.environ['HOME'],"
            "'session': os.environ.get('POLAR_SESSION'), 'caps': caps[0], 'nnp': nnp[0], 'groups': os.getgroups(),"
            "'files': sorted(os.listdir('.')), 'proxy': os.environ.get('HTTPS_PROXY')}));"
            "open('written-inside', 'w').write('x'); open(os.path.join(os.environ['HOME'], 'h'), 'w').write('y')")
    result, out, err = s.run(kind, py(code))
    assert result.exit_code == 0, err
    assert not result.timed_out and result.memory_limit == "none"
    info = json.loads(out)
    assert info["session"] == s.session and info["files"] == ["main.py"] and info["proxy"] is None
    assert (s.app / "written-inside").exists() and (s.home / "h").exists()
    if kind == "none":
        assert info["cwd"] == str(s.app) and info["home"] == str(s.home)
        return
    assert (info["uid"], info["gid"], info["cwd"], info["home"]) == (1000, 1000, "/app", "/home/agent")
    assert info["caps"] == "0000000000000000" and info["nnp"] == "1"
    assert 0 not in info["groups"]
    # uid 1000 for real: the files it wrote belong to uid 1000 on the host too (not to root through a user namespace)
    assert (s.app / "written-inside").stat().st_uid == 1000


def test_tmp_is_a_private_tmpfs_the_agent_can_write(isolated, run_dir):
    """/tmp is sticky and world-writable for uid 1000 (a root-owned 0755 tmpfs made Gemini CLI's shell tool fail with
    EACCES and Claude Code exit 0 after ~30 s without a model call)."""
    s = Sample(run_dir)
    code = ("import os, stat, tempfile, json; st = os.stat('/tmp'); d = tempfile.mkdtemp(prefix='probe-');"
            "print(json.dumps({'mode': oct(stat.S_IMODE(st.st_mode)), 'made': os.path.isdir(d)}))")
    result, out, err = s.run(isolated, py(code))
    assert result.exit_code == 0, err
    assert json.loads(out) == {"mode": "0o1777", "made": True}


def test_view_hides_the_host(isolated, run_dir, tmp_path):
    """Repository root, certs/, .cache/run/, RUN/, tasks' tests/ and solution/, /root, /etc/shadow, another sample."""
    task = tmp_path / "tasks" / "task-a"
    (task / "solution").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution" / "solve.sh").write_text("echo answer\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    me, other = Sample(run_dir, "task-a", 0), Sample(run_dir, "task-a", 1)
    secret = [str(ROOT / "README.md"), str(ROOT / "pyproject.toml"), str(ROOT / "certs"), str(ROOT / ".cache" / "run"), str(run_dir),
              str(run_dir / "run.json"), str(task / "solution" / "solve.sh"), str(task / "tests" / "test.sh"),
              str(task), str(other.app / "main.py"), str(other.home / ".secret-state"), str(other.app),
              str(me.app), str(me.home), "/root/.bashrc", "/etc/shadow", str(tmp_path),
              "/run/polar/ready"]  # the wrapper's ready line: an agent that could swallow it would look like infra
    secret += [str(p) for p in sorted((ROOT / "examples").glob("**/solution"))[:2]]
    # Where the runner mounts it (never at its host path: a checkout under /tmp would collide with the tmpfs).
    mounts = (sb.Mount(VENV, IN_VENV),) if VENV.is_dir() else ()
    result, out, err = me.run(isolated, py(PROBE) + secret, mounts=mounts)
    assert result.exit_code == 0, err
    seen = json.loads(out)
    assert {p: v for p, v in seen.items() if v == "readable"} == {}
    # and what it is given: its own app and home, the system, the venv's interpreter
    code = ("import os, json; print(json.dumps({'app': sorted(os.listdir('/app')), 'home': sorted(os.listdir("
            "os.environ['HOME'])), 'homes': sorted(os.listdir('/home')), 'root': sorted(os.listdir('/')),"
            "'rootdir': sorted(os.listdir('/root')) if os.path.isdir('/root') else None,"
            f"'repo': sorted(os.listdir({str(ROOT)!r})) if os.path.isdir({str(ROOT)!r}) else None}}))")
    result, out, err = me.run(isolated, py(code), mounts=mounts)
    seen = json.loads(out)
    assert seen["repo"] in (None, [])  # the repository root is not there
    assert seen["app"] == ["main.py"] and seen["home"] == [".secret-state"] and seen["homes"] == ["agent"]
    assert "tmp" in seen["root"] and "app" in seen["root"]
    assert seen["rootdir"] in (None, [], [".pyenv"])  # at most the path to the Python installation
    if mounts:
        result, out, err = me.run(isolated, [f"{IN_VENV}/bin/python", "-c",
                                             "import sys, msgpack; print(sys.version_info[:2] >= (3, 11))"],
                                  mounts=mounts)
        assert (result.exit_code, out.strip()) == (0, "True"), err


def test_verifier_view(isolated, run_dir, tmp_path):
    """The verifier's sandbox: the task's tests read-only at /tests, /logs/verifier writable, bash, git and
    python3 with pytest, no network."""
    has_pytest = subprocess.run([sb.SYSTEM_PYTHON, "-c", "import pytest"], capture_output=True).returncode == 0
    need(None if has_pytest else f"{sb.SYSTEM_PYTHON} cannot import pytest (Debian's python3-pytest)", setup=SYSTEM)
    s = Sample(run_dir)
    tests, logs = tmp_path / "task" / "tests", s.dir / "verifier"
    tests.mkdir(parents=True)
    logs.mkdir()
    (tests / "test_ok.py").write_text("def test_ok():\n    assert open('/app/main.py').read() == \"print('hi')\\n\"\n")
    (tests / "test.sh").write_text(
        "set -e\ncd /app\ngit --version >/dev/null\npython3 -m pytest -q -p no:cacheprovider /tests/test_ok.py >/dev/null\n"
        "if touch /tests/x 2>/dev/null; then echo 'tests writable'; exit 3; fi\n"
        "if python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)' 2>/dev/null; then exit 4; fi\n"
        "echo 1.0 > /logs/verifier/reward.txt\n")
    mounts = (sb.Mount(tests, "/tests"), sb.Mount(logs, "/logs/verifier", writable=True))
    result, out, err = s.run(isolated, ["bash", "/tests/test.sh"], mounts=mounts, session=None)
    assert result.exit_code == 0, out + err
    assert (logs / "reward.txt").read_text() == "1.0\n" and (logs / "reward.txt").stat().st_uid == 1000


# ---------------------------------------------------------------------------------------------- the network


def test_no_network_but_the_relay(isolated, run_dir, fake_proxy):
    """Direct TCP to the host fails (its loopback listener, the proxy port itself, its own address); through the
    relay a CONNECT reaches the proxy with the sample's session, though the client claimed another one; each
    connection is its own connection to the proxy; a real client (curl) using HTTPS_PROXY lands the same way."""
    listener = _free_port_listener()
    targets = [("127.0.0.1", listener.getsockname()[1]), ("127.0.0.1", fake_proxy.port)]
    if (ip := _host_ip()) is not None:
        targets.append((ip, listener.getsockname()[1]))
    s = Sample(run_dir)
    code = r"""
import base64, json, os, socket, sys
targets = json.loads(sys.argv[1])
direct = {}
for host, port in targets:
    try:
        socket.create_connection((host, port), timeout=3).close()
        direct[f"{host}:{port}"] = "connected"
    except OSError as e:
        direct[f"{host}:{port}"] = type(e).__name__
url = os.environ["HTTPS_PROXY"]
port = int(url.rsplit(":", 1)[1])
replies = []
for spoof in ("run-1%2Ftask-b%2F0%2F0:x", "run-1%2Ftask-a%2F0%2F0:x"):
    c = socket.create_connection(("127.0.0.1", port), timeout=5)
    c.sendall(b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n"
              b"Proxy-Authorization: Basic " + base64.b64encode(spoof.encode()) + b"\r\n\r\n")
    data = b""
    while chunk := c.recv(4096):
        data += chunk
    replies.append(data.decode())
print(json.dumps({"direct": direct, "replies": replies, "url": url, "no_proxy": os.environ.get("NO_PROXY")}))
"""
    try:
        result, out, err = s.run(isolated, py(code) + [json.dumps(targets)], proxy_port=fake_proxy.port)
    finally:
        listener.close()
    assert result.exit_code == 0, err
    seen = json.loads(out)
    assert set(seen["direct"].values()) <= {"ConnectionRefusedError", "OSError", "TimeoutError", "socket.timeout"}, seen
    assert "connected" not in seen["direct"].values()
    assert seen["url"] == "http://run-1%2Ftask-a%2F0%2F0:x@127.0.0.1:18080" and seen["no_proxy"] == ""
    assert all(r.endswith("from-proxy") for r in seen["replies"])
    assert fake_proxy.sessions() == [s.session, s.session]
    assert len(fake_proxy.received) == 2  # one proxy connection per client connection, never pooled
    if shutil.which("curl"):
        fake_proxy.received.clear()
        result, out, err = s.run(isolated, ["curl", "-sS", "--max-time", "5", "https://api.anthropic.com/v1/messages"],
                                 proxy_port=fake_proxy.port)
        assert result.exit_code != 0  # the fake proxy speaks no TLS
        assert fake_proxy.received and fake_proxy.received[0].startswith(b"CONNECT api.anthropic.com:443 ")
        assert fake_proxy.sessions() == [s.session]


def test_relay_without_isolation(run_dir, fake_proxy):
    """--sandbox none still goes through the relay: the identity holds even there."""
    s = Sample(run_dir)
    code = r"""
import base64, os, socket
port = int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])
c = socket.create_connection(("127.0.0.1", port), timeout=5)
c.sendall(b"CONNECT generativelanguage.googleapis.com:443 HTTP/1.1\r\nProxy-Authorization: Basic "
          + base64.b64encode(b"someone-else:x") + b"\r\n\r\n")
print(c.recv(4096).decode())
"""
    result, out, err = s.run("none", py(code), proxy_port=fake_proxy.port)
    assert result.exit_code == 0, err
    assert "from-proxy" in out and fake_proxy.sessions() == [s.session]


# ---------------------------------------------------------------------------------------------- limits


def _processes_matching(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_timeout_kills_the_whole_sandbox(kind, run_dir):
    s = Sample(run_dir)
    marker = str(3000 + uuid.uuid4().int % 999)
    label = f"t-{uuid.uuid4().hex[:8]}"
    seen_running: list[str] = []

    def watch():  # docker: the container carries the run label while it runs
        for _ in range(40):
            p = subprocess.run(["docker", "ps", "-q", "--filter", f"label=polar-run={label}"], capture_output=True,
                               text=True)
            if p.stdout.strip():
                seen_running.append(p.stdout.strip())
                return
            time.sleep(0.1)

    if kind == "docker":
        threading.Thread(target=watch, daemon=True).start()
    t0 = time.monotonic()
    result, _, err = s.run(kind, ["sh", "-c", f"sleep {marker}.5 & sleep {marker}.25; echo never"],
                           timeout=TIMEOUT_TEST_S, label=label)
    assert result.timed_out and result.exit_code is None, err
    # orderings: not before the timeout (less a coarse clock's 10 %), and long before the agent's own end (its sleeps
    # last `marker` seconds, 3000 or more)
    assert TIMEOUT_TEST_S * 0.9 <= result.wall_s < float(marker) and time.monotonic() - t0 < float(marker)
    # the background one too (polled: a killed process leaves /proc when it is reaped)
    assert _wait(lambda: _processes_matching(f"sleep\0{marker}.") == [], GONE_DEADLINE_S), \
        _processes_matching(f"sleep\0{marker}.")
    if kind == "docker":
        assert seen_running, "no container labelled polar-run=<label> while it ran"
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=polar-run={label}"], capture_output=True,
                              text=True).stdout.strip()
        assert left == ""


def test_exit_code_and_stdio(kind, run_dir):
    """The agent's exit code and output; what it leaves running in the background dies with it."""
    s = Sample(run_dir)
    marker = str(4000 + uuid.uuid4().int % 999)
    result, out, err = s.run(kind, ["sh", "-c", f"sleep {marker}.5 >/dev/null 2>&1 & echo to-out; echo to-err >&2; exit 7"])
    assert (result.exit_code, result.timed_out, out, err) == (7, False, "to-out\n", "to-err\n")
    assert _wait(lambda: _processes_matching(f"sleep\0{marker}.") == [], GONE_DEADLINE_S), \
        _processes_matching(f"sleep\0{marker}.")
    result, out, err = s.run(kind, ["sh", "-c", "kill -TERM $$"])
    assert result.exit_code == 128 + 15


def test_memory_limit_enforced_and_reported(kind, run_dir):
    s = Sample(run_dir)
    code = "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('allocated')"
    result, out, err = s.run(kind, py(code), memory_mb=96, cpus=1)
    assert "96" in result.memory_limit
    if kind == "docker":
        assert result.memory_limit.startswith("docker --memory 96m")
    else:
        assert result.memory_limit.startswith(("cgroup v1 memory", "cgroup v2 memory", "prlimit --as"))
    assert result.exit_code != 0 and "allocated" not in out
    result, out, err = s.run(kind, py("b = bytearray(16 * 1024 * 1024); print('small ok')"), memory_mb=96)
    assert (result.exit_code, out.strip()) == (0, "small ok"), err


@pytest.mark.parametrize("name", ["bwrap", "none"])
def test_memory_limit_without_a_cgroup_is_prlimit(name, request, run_dir, monkeypatch):
    _kind(request, name)
    monkeypatch.setattr(_Cgroup, "create", classmethod(lambda cls, memory_mb, cpus: None))
    s = Sample(run_dir)
    result, out, err = s.run(name, py("b = bytearray(256 * 1024 * 1024); print('allocated')"), memory_mb=96)
    assert result.memory_limit == "prlimit --as 96 MiB"
    assert result.exit_code == 1 and "MemoryError" in err and "allocated" not in out


# ---------------------------------------------------------------------------------------------- dying with the runner

# A "runner" in a process of its own: one `none` sandbox whose agent starts a child and a child in a session of its
# own (out of the process group), writes their pids and waits.
RUNNER = r"""
import sys
from pathlib import Path
from polar.rollout.sandbox import base as sb
from polar.rollout.sandbox.run import run_sandboxed
base = Path(sys.argv[1])
script = ("sleep 600 & c=$!; setsid sleep 600 & d=$!; "
          f"echo $$ $c $d > {base}/pids.tmp && mv {base}/pids.tmp {base}/pids; wait")
run_sandboxed(sb.SandboxSpec(kind="none", app=base / "app", home=base / "home", env={"PATH": sb.DEFAULT_PATH}),
              ["/bin/sh", "-c", script], stdout=base / "out", stderr=base / "err", timeout=600)
"""


def _alive(pid: int) -> bool:
    return _start_ticks(pid) is not None  # a zombie is gone


def _wrapper_running(control: Path) -> bool:
    """A live (not zombie) process whose argv names the control directory's relay.py: the sandbox's wrapper."""
    needle = f"{control}/relay.py".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if needle in fh.read().split(b"\0"):
                        return True
            except OSError:
                pass
    return False


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_none_sandbox_ends_the_agents_whole_tree_when_its_runner_is_killed_with_9(tmp_path):
    base = tmp_path / "sample"
    for d in ("app", "home"):
        (base / d).mkdir(parents=True)
    tmp = tempfile.mkdtemp(prefix="polar-t-")  # the control dir's base (short: its socket path is limited)
    runner = subprocess.Popen([str(VENV / "bin" / "python"), "-c", RUNNER, str(base)], stdin=subprocess.DEVNULL,
                              env={**os.environ, "TMPDIR": tmp})
    pids: list[int] = []
    try:
        assert _wait(lambda: (base / "pids").is_file() or runner.poll() is not None, 60), "the agent did not start"
        pids = [int(x) for x in (base / "pids").read_text().split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        runner.kill()
        runner.wait(timeout=10)
        gone = _wait(lambda: not any(_alive(p) for p in pids), 30)
        assert gone, [p for p in pids if _alive(p)]  # the agent, its child, and the one in its own session
        [control] = [d for d in Path(tmp).iterdir() if d.name.startswith(CONTROL_PREFIX)]
        # the wrapper ends itself after killing the tree (relay.die_with): give it the moment that takes
        assert _wait(lambda: not _wrapper_running(control), 30), "the sandbox wrapper outlived its runner"
        assert (control / OWNER_FILE).is_file()  # left by the dead runner: the next sweep's
        assert sweep_stale_controls([tmp]) == (1, 0) and not control.exists()
    finally:
        if runner.poll() is None:
            runner.kill()
        for p in pids:  # before the fix they lived on
            with contextlib.suppress(OSError):
                os.kill(p, 9)
        shutil.rmtree(tmp, ignore_errors=True)


def _control_dir(base: Path, name: str, owner: dict | str | None) -> Path:
    d = base / name
    d.mkdir()
    if owner is not None:
        (d / OWNER_FILE).write_text(owner if isinstance(owner, str) else json.dumps(owner))
    return d


def test_the_sweep_removes_only_dead_owners_control_dirs_and_kills_what_they_left(tmp_path):
    me, start = os.getpid(), _start_ticks(os.getpid())
    child = subprocess.Popen(["true"])
    child.wait()
    dead = {"pid": child.pid, "start": 1}
    made = {
        "dead": _control_dir(tmp_path, "polar-sbx-dead", dead),
        "reused": _control_dir(tmp_path, "polar-sbx-reused", {"pid": me, "start": start - 1}),  # pid now another's
        "live": _control_dir(tmp_path, "polar-sbx-live", {"pid": me, "start": start}),
        "live-no-start": _control_dir(tmp_path, "polar-sbx-nostart", {"pid": me, "start": None}),
        "no-owner": _control_dir(tmp_path, "polar-sbx-bare", None),  # not ours, or its owner has not written it yet
        "garbage": _control_dir(tmp_path, "polar-sbx-garbage", "{not json"),
        "other-name": _control_dir(tmp_path, "other-dead", dead),
    }
    target = _control_dir(tmp_path, "elsewhere", dead)
    (tmp_path / "polar-sbx-link").symlink_to(target)  # never followed
    (tmp_path / "polar-sbx-file").write_text(json.dumps(dead))
    procs = {name: subprocess.Popen(["sleep", "600"], env={"PATH": sb.DEFAULT_PATH,
                                                           SANDBOX_VAR: str(made[name])})
             for name in ("dead", "live")}
    try:
        assert sweep_stale_controls([str(tmp_path)]) == (2, 1)
        assert procs["dead"].wait(timeout=10) == -9 and procs["live"].poll() is None
        assert {n for n, d in made.items() if d.exists()} == {"live", "live-no-start", "no-owner", "garbage",
                                                              "other-name"}
        assert target.is_dir() and (tmp_path / "polar-sbx-link").is_symlink() and (tmp_path / "polar-sbx-file").exists()
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------------------------- failures


def test_a_sandbox_that_cannot_start_is_a_sandbox_error(isolated, run_dir):
    s = Sample(run_dir)
    bad = (sb.Mount(s.app / "main.py", "/usr/polar-no-such-mountpoint/x"),)  # inside the read-only /usr
    with pytest.raises(sb.SandboxError, match="did not start"):
        s.run(isolated, ["true"], mounts=bad)
    for reserved in ("/run/polar/relay.py", "/run/polar/ready/x", "/proc/x", "/run/polar"):
        with pytest.raises(sb.SandboxError, match="reserved"):  # the control directory's own files stay its own
            s.run(isolated, ["true"], mounts=(sb.Mount(s.app, reserved),))
    # an agent that fails is not one: command not found is the agent's exit code
    result, _, err = s.run(isolated, ["polar-no-such-command"])
    assert result.exit_code == 127 and "polar-no-such-command" in err
