"""Loopback stand-ins for what polar.launch talks to: a dev-mode vLLM server (in a thread, or as the process
`polar.launch.vllm.start` launches through a fake vLLM environment) and a proxy's control endpoints.

The fake vLLM serves the weights it was started with or last reloaded: its 1-token logprob probe is a function of
that directory's path, so a reload to other weights changes it and a reload back restores it. Every request is
appended to `events` as (who, method, path, body) — one list for all fakes of a test, so the order of hold, reload
and release across servers is what the test reads. Standard library only: the process form runs under any Python.

As a process: `python fakes.py LAUNCHER serve WEIGHTS --port P [...]` (the command line `start` builds); env
FAKE_VLLM_MODE=exit exits at once with code 3, FAKE_VLLM_MODE=unhealthy answers /health with 503,
FAKE_VLLM_MODE=stuck-version ignores /update_weight_version; FAKE_VLLM_EXIT_DEVICE=D exits with code 3 when it was
given CUDA device D (one replica of a pool that fails); FAKE_VLLM_ARGV_FILE=F writes its argv to F as JSON. Its
first log line names its CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1


def model_dir(where: Path, name: str = "m", config: str = "{}") -> Path:
    """A directory that passes for a checkpoint: config.json and a (empty) safetensors file."""
    where = where / name
    where.mkdir(parents=True)
    (where / "config.json").write_text(config)
    (where / "model.safetensors").write_bytes(b"")
    return where


def probe_of(weights: str) -> dict:
    # all 32 bits of the digest: `% 1000` made two directories' probes equal once in a thousand tmp paths (CI red)
    digest = int(hashlib.sha256(weights.encode()).hexdigest()[:8], 16)
    return {"a": -0.1 - digest / 2 ** 32, "b": -3.0}


class _Handler(BaseHTTPRequestHandler):
    fake: "Fake"

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.loads(raw) if raw.strip() else None
        self.fake.events.append((self.fake.name, method, self.path, body))
        status, doc = self.fake.answer(method, self.path, body, self.headers)
        self._answer(status, doc)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")


class Fake:
    """A ThreadingHTTPServer on a free loopback port; `answer` decides each reply."""

    def __init__(self, name: str, events: list | None = None, port: int = 0):
        self.name = name
        self.events = events if events is not None else []
        handler = type("Handler", (_Handler,), {"fake": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def answer(self, method: str, path: str, body, headers) -> tuple[int, dict]:
        raise NotImplementedError

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeVllm(Fake):
    """A dev-mode vLLM: /health, /weight_info, /pause, /resume, /collective_rpc reload_weights, /reset_prefix_cache,
    /update_weight_version, /v1/completions (the probe), /v1/chat/completions (the warm-up). `fail` maps a path to
    the HTTP status it answers with; `ignore_reload` keeps the old weights whatever reload_weights says."""

    def __init__(self, name: str, weights: str, events: list | None = None, port: int = 0, version: str = "default"):
        super().__init__(name, events, port)
        self.weights, self.version = weights, version
        self.fail: dict[str, int] = {}
        self.ignore_reload = False
        self.stuck_version = False
        self.healthy = True

    def answer(self, method, path, body, headers):
        route = path.split("?", 1)[0]
        if route in self.fail:
            return self.fail[route], {"error": f"fake failure of {route}"}
        if route == "/health":
            return (200, {}) if self.healthy else (503, {})
        if route == "/weight_info":
            return 200, {"weight_version": self.version}
        if route == "/collective_rpc":
            if not self.ignore_reload:
                self.weights = body["kwargs"]["weights_path"]
            return 200, {"results": [None]}
        if route == "/update_weight_version":
            self.version = self.version if self.stuck_version else body["new_version"]
            return 200, {}
        if route == "/v1/completions":
            return 200, {"choices": [{"logprobs": {"top_logprobs": [probe_of(self.weights)]}}]}
        if route == "/v1/models":
            return 200, {"data": [{"id": "fake"}]}
        return 200, {}  # /pause, /resume, /reset_prefix_cache, the warm-up chat call


class FakeProxy(Fake):
    """A proxy's control endpoints: hold, release {weight_version}, state {held, in_flight, weight_version}.
    `refuse` answers every call with 403; `in_flight` is what state reports."""

    def __init__(self, name: str, token: str, events: list | None = None):
        super().__init__(name, events)
        self.token = token
        self.held, self.version, self.in_flight = False, None, 0
        self.refuse = False

    def answer(self, method, path, body, headers):
        if self.refuse or headers.get("x-polar-control-token") != self.token:
            return 403, {"error": "wrong x-polar-control-token"}
        if path == "/admin/hold":
            self.held = True
        elif path == "/admin/release":
            self.held = False
            self.version = (body or {}).get("weight_version", self.version)
        return 200, {"held": self.held, "in_flight": self.in_flight, "weight_version": self.version}


def _serve_as_vllm(argv: list[str]) -> None:
    """The process form: the command line of `vllm serve` after the launcher's path."""
    mode = os.environ.get("FAKE_VLLM_MODE", "")
    device = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(f"fake vllm {' '.join(argv)} (CUDA_VISIBLE_DEVICES={device})", flush=True)
    if os.environ.get("FAKE_VLLM_ARGV_FILE"):  # the command line exactly as it reached `vllm serve`
        Path(os.environ["FAKE_VLLM_ARGV_FILE"]).write_text(json.dumps(argv))
    if mode == "exit" or (device is not None and device == os.environ.get("FAKE_VLLM_EXIT_DEVICE")):
        print("fake vllm: refusing to start", flush=True)
        sys.exit(3)
    weights = argv[argv.index("serve") + 1]
    port = int(argv[argv.index("--port") + 1])
    fake = FakeVllm("vllm", str(Path(weights)), port=port)
    fake.healthy = mode != "unhealthy"
    fake.stuck_version = mode == "stuck-version"
    fake.server.serve_forever()


if __name__ == "__main__":
    _serve_as_vllm(sys.argv[1:])
