"""The python: agent of tests/rollout/test_isolation.py (`--agent python:probeagent:run`), copied into the test
task's agent/ folder with `probe_config.json` beside it (written by the test: the host paths, ports and addresses to
probe). From inside the sandbox it tries every way out it should not have, makes one real model call through the
proxy with another sample's session in its proxy URL (then, on that path, requests to a provider host that are no
model call: vLLM's own admin paths), and writes every outcome to /app/probe.json (the task's
verifier copies it to /logs/verifier/, which lands in RUN/samples/<task>/<k>/<attempt>/verifier/).

Outcomes are plain strings: `ok` (it worked: a hole), or the errno name / exception that stopped it; proxy probes
record the status code the proxy answered.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import socket
import time
from urllib.parse import quote, urlsplit


def _err(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return type(exc).__name__


def probe_path(path: str) -> str:
    """`ok` when the path can be read (a file) or listed (a directory), else the errno that stopped it."""
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        return "ok"
    except OSError as e:
        return _err(e)


def connect(family: int, addr: tuple, timeout: float = 2.0) -> str:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(addr)
        return "ok"
    except OSError as e:
        return _err(e)
    finally:
        s.close()


def scan_loopback() -> tuple[list[int], dict[str, int]]:
    """Every TCP port on 127.0.0.1 tried (a fresh blocking socket each: a reused one alternates ECONNABORTED):
    the ports that accepted, and how many ended in each errno."""
    found, outcomes = [], {}
    for port in range(1, 65536):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            code = s.connect_ex(("127.0.0.1", port))
            # an ephemeral port can be picked as its own source port: TCP's simultaneous open connects the socket
            # to itself (no listener); counted apart
            if code == 0 and s.getsockname() == s.getpeername():
                code = -1
        finally:
            s.close()
        if code == 0:
            found.append(port)
        elif code == -1:
            outcomes["self-connect"] = outcomes.get("self-connect", 0) + 1
        else:
            name = errno.errorcode.get(code, str(code))
            outcomes[name] = outcomes.get(name, 0) + 1
    return found, outcomes


def unix_connect(path: str) -> str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(path)
        return "ok"
    except OSError as e:
        return _err(e)
    finally:
        s.close()


def through_proxy(proxy: tuple[str, int], head: str, then: bytes = b"", body: bool = False) -> dict:
    """Send one request head to the proxy (via the sandbox's relay); the status it answered, and whether a tunnel
    opened (then `then` is sent through it)."""
    out: dict = {"status": None, "line": None, "tunnel_reply": None}
    try:
        with socket.create_connection(proxy, timeout=10) as s:
            s.sendall(head.encode())
            buf = b""
            while b"\r\n\r\n" not in buf and len(buf) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
            first = buf.split(b"\r\n", 1)[0].decode(errors="replace")
            out["line"] = first
            parts = first.split()
            out["status"] = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
            if body:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                out["body"] = buf.split(b"\r\n\r\n", 1)[-1].decode(errors="replace")
            if out["status"] == 200 and head.startswith("CONNECT") and then:
                s.sendall(then)
                out["tunnel_reply"] = s.recv(200).decode(errors="replace")
    except OSError as e:
        out["error"] = _err(e)
    return out


def spoofed_proxy(cfg: dict, env: dict, k: int) -> str:
    """The proxy URL with another run's session as its user name."""
    url = urlsplit(env["HTTPS_PROXY"])
    return f"http://{quote(cfg['spoofed_session'][str(k)], safe='')}:x@{url.hostname}:{url.port}"


def model_call(cfg: dict, env: dict, k: int) -> dict:
    """One real model call through the spoofed proxy URL (left in os.environ for what follows)."""
    os.environ["HTTPS_PROXY"] = os.environ["https_proxy"] = spoofed_proxy(cfg, env, k)
    try:
        import openai

        client = openai.OpenAI(api_key="sk-polar-dummy", max_retries=0, timeout=cfg.get("model_call_timeout_s", 60))
        reply = client.chat.completions.create(
            model="polar-test", max_tokens=16, messages=[{"role": "user", "content": f"probe sample {k}"}])
        return {"ok": True, "content": reply.choices[0].message.content}
    except Exception as e:  # noqa: BLE001 — recorded, the test says what went wrong
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def run(instruction: str, workdir: str, env: dict) -> int | None:
    cfg = json.loads((pathlib.Path(__file__).with_name("probe_config.json")).read_text())
    app = pathlib.Path(workdir)
    k = int(env["POLAR_SAMPLE"])
    res: dict = {"k": k, "session_env": env.get("POLAR_SESSION"), "uid": os.getuid(), "t_start": time.time()}
    # a marker in this sample's own workdir and HOME (the other sample looks for them by their host paths)
    (app / "marker.txt").write_text(f"sample {k}\n")
    pathlib.Path(env["HOME"], "marker.txt").write_text(f"sample {k}\n")

    # --- one real model call, with another run's session in the proxy URL (the relay must put ours back). It is
    # also the rendezvous: the test's upstream holds each sample's answer until both samples are parked in their call,
    # so when it returns the other sample is running too (the test checks the time against its start and end)
    res["model_call"] = model_call(cfg, env, k)
    # --- the other sample's workdir and HOME by their host paths, while it runs
    res["t_other"] = time.time()
    res["other_sample"] = {p: probe_path(p) for p in cfg["other_sample_paths"][str(k)]}
    # --- the host's files by their absolute paths
    res["paths"] = {p: probe_path(p) for p in cfg["paths"]}
    # --- what every sample shares (the venv, the agent folder, the Python installation, the system) is read-only
    res["writes"] = {}
    for target in cfg["write_targets"]:
        try:
            with open(target, "ab") as f:  # appends to an existing file, creates a missing one
                f.write(b"")
            res["writes"][target] = "ok"
        except OSError as e:
            res["writes"][target] = _err(e)
    # --- processes and mounts: nothing of the host or the other sample
    cmdlines = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdlines.append(pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                pass
    res["processes"] = cmdlines
    res["mountinfo"] = pathlib.Path("/proc/self/mountinfo").read_text()
    res["tmp"] = sorted(os.listdir("/tmp"))

    # --- direct connections
    if cfg["full_scan"] == k:  # one sample tries every loopback port (a few seconds), the other the host's ports
        t = time.monotonic()
        res["loopback_open_ports"], res["loopback_refused"] = scan_loopback()
        res["loopback_scan_s"] = round(time.monotonic() - t, 2)
    res["direct"] = {}
    for ip in cfg["host_ips"]:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        for port in cfg["host_ports"]:
            res["direct"][f"[{ip}]:{port}"] = connect(family, (ip, port))
    res["unix"] = {p: unix_connect(p) for p in cfg["unix_sockets"]}

    # --- through the proxy (the relay at HTTPS_PROXY's host:port)
    url = urlsplit(env["HTTPS_PROXY"])
    proxy = (url.hostname, url.port)
    up = cfg["upstream_port"]
    res["proxy"] = {
        "ready": through_proxy(proxy, "GET http://polar.gateway/ready HTTP/1.1\r\nHost: polar.gateway\r\n\r\n",
                               body=True),
        "connect_other_host": through_proxy(proxy, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"),
        "connect_vllm": through_proxy(
            proxy, f"CONNECT 127.0.0.1:{up} HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\n\r\n",
            then=f"GET /v1/models?probe=connect-vllm HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\n\r\n".encode()),
        "connect_provider_80": through_proxy(
            proxy, "CONNECT api.openai.com:80 HTTP/1.1\r\nHost: api.openai.com:80\r\n\r\n",
            then=b"GET /v1/models?probe=connect-provider-80 HTTP/1.1\r\nHost: api.openai.com\r\n\r\n"),
        "http_vllm": through_proxy(
            proxy, f"GET http://127.0.0.1:{up}/v1/models?probe=http-vllm HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\n\r\n"),
        "http_vllm_chat": through_proxy(
            proxy, f"POST http://127.0.0.1:{up}/v1/chat/completions?probe=http-vllm-chat HTTP/1.1\r\n"
                   f"Host: 127.0.0.1:{up}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"),
        "http_admin": through_proxy(
            proxy, "GET http://polar.gateway/admin/probe-admin HTTP/1.1\r\nHost: polar.gateway\r\n\r\n"),
        "http_admin_post": through_proxy(
            proxy, "POST http://polar.gateway/admin/shutdown?probe=admin HTTP/1.1\r\nHost: polar.gateway\r\n"
                   "Content-Length: 0\r\n\r\n"),
        "http_provider_80": through_proxy(
            proxy, "POST http://api.openai.com/v1/chat/completions?probe=provider-80 HTTP/1.1\r\n"
                   "Host: api.openai.com\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"),
        "http_provider_80_get": through_proxy(
            proxy, "GET http://api.openai.com/v1/models?probe=provider-80-get HTTP/1.1\r\n"
                   "Host: api.openai.com\r\n\r\n"),
    }

    res["t_end"] = time.time()
    # --- inside a provider's decrypted tunnel: paths that are no model call must not reach the backend
    res["provider_paths"] = {}
    try:
        import httpx

        with httpx.Client(proxy=spoofed_proxy(cfg, env, k), verify=env["SSL_CERT_FILE"], timeout=30) as client:
            for method, url in cfg["provider_paths"]:
                try:
                    r = client.request(method, url, json={} if method == "POST" else None,
                                       headers={"authorization": "Bearer sk-polar-dummy"})
                    res["provider_paths"][f"{method} {url}"] = r.status_code
                except Exception as e:  # noqa: BLE001
                    res["provider_paths"][f"{method} {url}"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001
        res["provider_paths"]["error"] = f"{type(e).__name__}: {e}"

    (app / "probe.json").write_text(json.dumps(res, indent=1))
    (app / "answer.txt").write_text("42\n")
    return 0
