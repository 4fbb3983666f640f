"""The sandbox's one network path out: a Unix socket, and the relay on each end of it.

Host end (`HostRelay`, in the runner's process): listens on a Unix socket in the sample's private control directory
(bound into the sandbox at /run/polar/proxy.sock). Every accepted connection gets its own new TCP connection to the
proxy on 127.0.0.1 (never pooled), and the first request head is rewritten so its `Proxy-Authorization` names the
sample's session and nothing else — whatever the client put in its proxy URL. A CONNECT is then tunnelled raw; a
plain-HTTP request is sent with `Connection: close` and its body (Content-Length only), and nothing after it, so no
second request can ride on the connection under a session of the client's choosing. An origin-form request (an
agent whose base URL is the relay's address, --connect base-url) also gets the proxy's own address as its Host.

Sandbox end (`python3 relay.py sandbox ...`, stdlib only, run by the sandbox's python: the host's, or in an image
the runtime's): the wrapper the sandbox starts. It reads the agent's environment from a JSON file, drops to the
unprivileged uid when it starts as root (bwrap as root), listens on 127.0.0.1:PORT in the sandbox's own loopback and
forwards each connection to the socket, sets HTTPS_PROXY/https_proxy to it (with POLAR_CONNECT=base_url: fills its
address into the base-URL variables instead, and sets no proxy), signals "ready" on a FIFO (the host tells a sandbox
that never started — an infrastructure failure — from an agent that failed), then runs the agent as its child and
exits with the agent's status (128+N for signal N), reaping orphans (it may be pid 1 in a container).

Without a sandbox (`--die-with PID`, `--sandbox none`) nothing else would end the agent with the runner: the wrapper
is a child subreaper (descendants that detach stay its own), asks for a signal when the runner dies (kill -9
included), gives the agent PR_SET_PDEATHSIG SIGKILL in case the wrapper itself is killed, and kills every descendant
left when the agent ends or the runner is gone.

This file must stay importable and runnable on its own (it is copied into each sandbox's control directory).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
from urllib.parse import quote

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 60.0
BUF = 64 * 1024


def proxy_user(session: str) -> str:
    """The session as a proxy user name: percent-encoded, every reserved character included."""
    return quote(session, safe="")


def basic_auth(session: str) -> str:
    return "Basic " + base64.b64encode(f"{proxy_user(session)}:x".encode()).decode("ascii")


# ---------------------------------------------------------------------------------------------- byte pumping


def pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both directions have ended; half-closes are passed on. Closes neither socket."""
    sel = selectors.DefaultSelector()
    peer = {a: b, b: a}
    open_ends = {a, b}
    for s in (a, b):
        s.setblocking(True)
        sel.register(s, selectors.EVENT_READ)
    try:
        while open_ends:
            for key, _ in sel.select():
                src = key.fileobj
                try:
                    data = src.recv(BUF)
                except (ConnectionError, OSError):
                    data = b""
                    open_ends.clear()  # a reset: nothing more will flow either way
                if data:
                    try:
                        peer[src].sendall(data)
                    except (ConnectionError, OSError):
                        open_ends.clear()
                    continue
                sel.unregister(src)
                open_ends.discard(src)
                try:
                    peer[src].shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                if not open_ends:
                    break
    finally:
        sel.close()


def _close(*socks: socket.socket | None) -> None:
    for s in socks:
        if s is not None:
            with contextlib.suppress(OSError):
                s.close()


# ---------------------------------------------------------------------------------------------- the host end


class HeadError(ValueError):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def rewrite_head(head: bytes, auth: str, origin_host: bytes | None = None) -> tuple[bytes, str, int]:
    """(new head, method, body length to forward) for one request head ending in CRLF CRLF.

    Every Proxy-Authorization line is dropped and ours is put first. An origin-form request (`POST /openai/v1/...`,
    an agent whose base URL is the relay's address: --connect base-url) is addressed to the proxy itself, so its
    Host becomes `origin_host`, the proxy's own address, which the gateway requires of such requests. Refuses (HeadError) what could be read two
    ways: bare CR or LF, NUL, obs-fold continuation lines, a malformed request line; for plain HTTP also
    Transfer-Encoding (we forward a counted body only) and a bad Content-Length."""
    if not head.endswith(b"\r\n\r\n"):
        raise HeadError("400 Bad Request", "request head not terminated")
    lines = head[:-4].split(b"\r\n")
    if any(b"\r" in ln or b"\n" in ln or b"\0" in ln for ln in lines):
        raise HeadError("400 Bad Request", "bare CR, LF or NUL in the request head")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith(b"HTTP/1."):
        raise HeadError("400 Bad Request", "malformed request line")
    method = parts[0].decode("ascii").upper()
    out = [lines[0], b"Proxy-Authorization: " + auth.encode("ascii")]
    to_proxy = origin_host is not None and parts[1].startswith(b"/")
    if to_proxy:
        out.append(b"Host: " + origin_host)
    body = 0
    lengths: set[bytes] = set()
    for ln in lines[1:]:
        if ln[:1] in (b" ", b"\t"):
            raise HeadError("400 Bad Request", "obs-fold header continuation")
        name, sep, value = ln.partition(b":")
        if not sep or not name or name != name.strip():
            raise HeadError("400 Bad Request", "malformed header line")
        lname = name.lower()
        if lname == b"proxy-authorization" or (to_proxy and lname == b"host"):
            continue
        if method != "CONNECT":
            if lname in (b"connection", b"proxy-connection", b"keep-alive"):
                continue
            if lname == b"transfer-encoding":
                raise HeadError("411 Length Required", "plain-HTTP requests through the sandbox relay need Content-Length")
            if lname == b"content-length":
                lengths.add(value.strip())
        out.append(ln)
    if method != "CONNECT":
        if len(lengths) > 1:
            raise HeadError("400 Bad Request", "conflicting Content-Length")
        if lengths:
            raw = lengths.pop()
            if not raw.isdigit():
                raise HeadError("400 Bad Request", "bad Content-Length")
            body = int(raw)
        out.append(b"Connection: close")
    return b"\r\n".join(out) + b"\r\n\r\n", method, body


def _reply(sock: socket.socket, status: str, message: str) -> None:
    body = f"polar sandbox relay: {message}\n".encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    with contextlib.suppress(OSError):
        sock.sendall(head.encode() + body)


def _read_head(client: socket.socket) -> tuple[bytes | None, bytes]:
    """(the first request head through CRLF CRLF, the bytes after it); (None, b"") when the client gave up or sent
    a head over MAX_HEAD (then it was answered)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            _reply(client, "431 Request Header Fields Too Large", "request head over 64 KiB")
            return None, b""
        chunk = client.recv(BUF)
        if not chunk:
            return None, b""
        buf += chunk
    end = buf.index(b"\r\n\r\n") + 4
    return buf[:end], buf[end:]


def _forward_one_request(client: socket.socket, upstream: socket.socket, head: bytes, rest: bytes, body_len: int):
    """Plain HTTP: the head, exactly its counted body, then nothing more from the client; the answer back."""
    body = rest[:body_len]
    upstream.sendall(head + body)
    remaining = body_len - len(body)
    while remaining > 0:
        chunk = client.recv(min(BUF, remaining))
        if not chunk:
            break
        upstream.sendall(chunk)
        remaining -= len(chunk)
    while chunk := upstream.recv(BUF):
        client.sendall(chunk)


class HostRelay:
    """The host end for one sample: Unix socket `path` → a new TCP connection to 127.0.0.1:`proxy_port` per accept."""

    def __init__(self, path: str, proxy_port: int, session: str, *, owner: tuple[int, int] | None = None,
                 proxy_host: str = "127.0.0.1", refuse: str | None = None):
        self.path = path
        self.refuse = refuse  # a tripwire: every request is answered 403 with this text, and counted
        self.proxy = (proxy_host, proxy_port)
        self.origin_host = (f"[{proxy_host}]" if ":" in proxy_host else proxy_host).encode() + b":%d" % proxy_port
        self.auth = basic_auth(session)
        self.connections = 0  # accepted so far
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        self._closed = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # No umask change here: the umask is process-wide, and a sample thread making its /app or HOME at that
            # moment got a 0600 directory (EACCES inside the sandbox). The socket's directory is private (0700)
            # until the socket has its owner and mode (the caller opens the directory afterwards).
            self._listener.bind(path)
            if owner is not None:
                os.chown(path, *owner)
            os.chmod(path, 0o600)
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._thread = threading.Thread(target=self._accept_loop, name=f"polar-relay:{os.path.basename(os.path.dirname(path))}",
                                        daemon=True)
        self._thread.start()

    def __enter__(self) -> HostRelay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    _close(client)
                    return
                self.connections += 1
                self._live.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, s: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._live.add(s)
            return True

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(HEAD_TIMEOUT_S)
            head, rest = _read_head(client)
            if head is None:
                return
            if self.refuse is not None:
                _reply(client, "403 Forbidden", self.refuse)
                return
            try:
                new_head, method, body_len = rewrite_head(head, self.auth, self.origin_host)
            except HeadError as e:
                _reply(client, e.status, str(e))
                return
            try:
                upstream = socket.create_connection(self.proxy, timeout=10)
            except OSError as e:
                self.errors.append(f"proxy {self.proxy[0]}:{self.proxy[1]} unreachable: {e}")
                _reply(client, "502 Bad Gateway", f"proxy {self.proxy[0]}:{self.proxy[1]} unreachable")
                return
            if not self._track(upstream):
                return
            upstream.settimeout(None)
            client.settimeout(None)
            if method == "CONNECT":
                upstream.sendall(new_head + rest)
                pump(client, upstream)
            else:
                _forward_one_request(client, upstream, new_head, rest, body_len)
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                self._live.discard(client)
                if upstream is not None:
                    self._live.discard(upstream)
            _close(client, upstream)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self._live)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        _close(self._listener)
        for s in live:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)
        try:
            os.unlink(self.path)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------- the sandbox end


def _drop_privileges(uid: int, gid: int) -> None:
    """Root inside a bwrap started by root: become uid:gid for real (the host's uid too), no capabilities left."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
    for cap in range(64):  # best effort: needs CAP_SETPCAP
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise RuntimeError("privileges could be regained after the drop")


def _sandbox_forward(client: socket.socket, sock_path: str) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(sock_path)
        pump(client, up)
    except OSError:
        pass
    finally:
        _close(client, up)


def _sandbox_accept(listener: socket.socket, sock_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_sandbox_forward, args=(client, sock_path), daemon=True).start()


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="relay.py sandbox")
    ap.add_argument("--env", required=True, help="JSON file: {env: {...}, proxy_user: str | null}")
    ap.add_argument("--ready", help="FIFO to write 'ready' to once set up")
    ap.add_argument("--socket", help="the host end's Unix socket; absent = no network path at all")
    ap.add_argument("--port", type=int, default=0, help="loopback port to listen on (0: any)")
    ap.add_argument("--drop", help="UID:GID to become when started as root")
    ap.add_argument("--die-with", type=int, help="the runner's pid: the agent's whole tree dies with it (no sandbox)")
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    args.cmd = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return args


RELAY_ADDRESS = "@POLAR_RELAY@"  # in an env value: the relay's address, filled in once it listens
CONNECT_VAR = "POLAR_CONNECT"  # "base_url": the agent reaches the gateway by base URL, not as a proxy


def _listen(env: dict[str, str], proxy_user_name: str | None, port: int, all_proxies: bool = False) -> socket.socket:
    """The relay's listener on the sandbox's own loopback; the agent's proxy variables point at it, or with
    POLAR_CONNECT=base_url its base-URL variables (values holding RELAY_ADDRESS) do, and no proxy is set."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # a warm slot's next sample binds the port while the last one's connections are in TIME_WAIT (rollout/sandbox/warm.py)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    if env.get(CONNECT_VAR) == "base_url":
        for name, value in list(env.items()):
            if RELAY_ADDRESS in value:
                env[name] = value.replace(RELAY_ADDRESS, address)
        for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(name, None)
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
        return listener
    env["HTTPS_PROXY"] = env["https_proxy"] = f"http://{proxy_user_name or 'sandbox'}:x@{address}"
    if all_proxies:  # a tripwire: plain-HTTP clients (an http:// index) are caught too
        env.update(dict.fromkeys(("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"), env["HTTPS_PROXY"]))
    env["NO_PROXY"] = env["no_proxy"] = ""
    return listener


def _signal_ready(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, f"ready {os.getpid()} {os.getuid()}\n".encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------- dying with the runner

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
RUNNER_GONE = signal.SIGUSR2  # the wrapper's parent-death signal: a signal nobody else sends it


def _prctl(option: int, value: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def proc_table() -> dict[int, tuple[int, bytes]]:
    """pid → (ppid, state) of every process /proc shows (in a sandbox: its pid namespace's)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                out[int(entry)] = (int(fields[1]), fields[0])
            except (OSError, ValueError, IndexError):
                continue
    return out


def _descendants(root: int) -> list[int]:
    """Every live descendant of `root` (from /proc: pid → ppid)."""
    parent = {pid: ppid for pid, (ppid, _) in proc_table().items()}
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def kill_descendants() -> None:
    """SIGKILL every descendant and reap it; again until none is left (one may fork while we look)."""
    for _ in range(20):
        kids = _descendants(os.getpid())
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap_children()


KILL_ROUNDS = 200  # SIGKILL sweeps before a sandbox counts as not clean (a fork bomb outrunning them)


def _reap_children() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def kill_all_but_ancestors() -> tuple[int, bool]:
    """A warm slot's sweep between samples (rollout/sandbox/warm.py): SIGKILL every process of the sandbox's pid namespace but
    this one and its ancestors (the wrapper, bwrap), until none is left: (how many were killed, whether none is)."""
    import time

    table = proc_table()
    keep, p = {os.getpid()}, os.getpid()
    while p in table and table[p][0] not in keep and table[p][0] > 0:
        p = table[p][0]
        keep.add(p)
    killed = set()
    for _ in range(KILL_ROUNDS):
        others = [pid for pid, (_, state) in proc_table().items() if pid not in keep and state != b"Z"]
        if not others:
            return len(killed), True
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        _reap_children()  # our own; the leader's orphans go to the namespace's init
        time.sleep(0.002)
    return len(killed), False


def die_with(parent: int) -> None:
    """Tie this wrapper to the runner `parent` (see the module docstring). Exits if the runner is already gone."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)

    def gone(_signum, _frame):
        kill_descendants()
        os._exit(128 + RUNNER_GONE)

    signal.signal(RUNNER_GONE, gone)
    _prctl(PR_SET_PDEATHSIG, RUNNER_GONE)
    if os.getppid() != parent:  # it died before the request above took effect
        gone(RUNNER_GONE, None)


def _run_agent(cmd: list[str], env: dict[str, str], before_wait, tied: bool = False) -> int:
    """Fork and exec the agent, forward signals to it, reap every child (pid 1 in a container reaps orphans) and
    return the agent's exit status (128+N for signal N). `tied`: the agent dies with this wrapper."""
    wrapper = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, RUNNER_GONE):
                signal.signal(sig, signal.SIG_DFL)
            if tied:
                _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != wrapper:  # the wrapper is already gone
                    os._exit(128 + signal.SIGKILL)
            os.execvpe(cmd[0], cmd, env)
        except OSError as e:
            os.write(2, f"polar sandbox: cannot run {cmd[0]!r}: {e.strerror}\n".encode())
        os._exit(127)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    before_wait()
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 125
        except InterruptedError:
            continue
        if got == pid:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def sandbox_main(argv: list[str]) -> int:
    args = _parse(argv)
    if not args.cmd:
        print("polar sandbox: no command", file=sys.stderr)
        return 125
    if args.die_with:
        die_with(args.die_with)
    if args.drop and os.getuid() == 0:  # first: the files below belong to the sandbox's uid
        uid, gid = (int(x) for x in args.drop.split(":"))
        _drop_privileges(uid, gid)
    _prctl(PR_SET_DUMPABLE, 0)  # the agent (the same uid) cannot ptrace the wrapper or open its fds in /proc
    with open(args.env, encoding="utf-8") as f:
        spec = json.load(f)
    env: dict[str, str] = dict(spec["env"])
    listener = _listen(env, spec.get("proxy_user"), args.port, bool(spec.get("all_proxies"))) if args.socket else None
    if args.ready:
        _signal_ready(args.ready)

    def start_relay() -> None:  # after the fork: the agent never shares the relay's threads
        if listener is not None:
            threading.Thread(target=_sandbox_accept, args=(listener, args.socket), daemon=True).start()

    code = _run_agent(args.cmd, env, start_relay, tied=bool(args.die_with))
    if args.die_with:  # nothing the agent started outlives it (a sandbox's namespace would end them too)
        kill_descendants()
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sandbox"]:
        code = sandbox_main(argv[1:])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # relay threads die with us
    print("usage: relay.py sandbox --env FILE [--ready FIFO] [--socket PATH --port P] [--drop UID:GID] "
          "[--die-with PID] -- CMD...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
