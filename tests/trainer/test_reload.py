"""Weight publication (docs/architecture.md#the-trainer-side): `scripts/vllm reload` against the shared float32 dev-mode
tiny server, with a real proxy (scripts/proxy, the .venv's mitmdump) in front of it.

Scenarios: 1.1 after a reload to a perturbed checkpoint the logprobs recorded through the proxy are the new
checkpoint's (a transformers recompute), not the old one's, and records carry the new version · 1.2 agents streaming
through a reload all finish · 1.3 a reloader killed between hold and release: the hold expires, serving resumes ·
2.x bad input is exit 2. The original weights are reloaded when the module ends (the server is shared).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from polar import records as rec
from tests.support.gateway import start_gateway
from tests.support.servers import wait_for

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
VLLM = [sys.executable, str(ROOT / "scripts" / "vllm")]
TINY = ROOT / ".cache" / "models" / "tiny"
CHAT = "https://api.openai.com/v1/chat/completions"
PINNED = "polar_sampling_override=temperature=1.0,top_p=1.0,top_k=-1"


def reload(server, weights: Path, version: str, *proxy_json: str, timeout: float = 300) -> subprocess.CompletedProcess:
    args = [*VLLM, "reload", "--weights", str(weights), "--version", version, "--run-file", server.run_file]
    if proxy_json:
        args += ["--proxy-json", *proxy_json]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory) -> Path:
    """A copy of the tiny model with its MLP weights scaled: the same tensor names, other logprobs."""
    out = tmp_path_factory.mktemp("perturbed") / "tiny-step-1"
    shutil.copytree(TINY, out)
    tensors = load_file(str(TINY / "model.safetensors"))
    scaled = {name: (t * 1.5 if ".mlp." in name else t).contiguous() for name, t in tensors.items()}
    save_file(scaled, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def served(dev_server):
    """The shared server, given back with the weights and version it had (model dir, "default"...)."""
    with open(dev_server.run_file) as fh:
        before = json.load(fh)
    yield dev_server
    proc = reload(dev_server, Path(before["weights_dir"]), before.get("weight_version") or "default")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def gateway(served, tmp_path_factory):
    base = tmp_path_factory.mktemp("reload-proxy")
    with start_gateway(served.base_url, str(base / "run"), str(base / "flows"), sets=[PINNED]) as gw:
        yield gw


def proxy_json(gw) -> str:
    return os.path.join(gw.run_dir, "proxy.json")


def chat(gw, stream: bool = False, max_tokens: int = 12, text: str = "Tell me a story about a fox.") -> httpx.Response:
    with gw.http_client("reload", timeout=120) as client:
        return client.post(CHAT, json={"model": "tiny", "stream": stream, "max_tokens": max_tokens,
                                       "messages": [{"role": "user", "content": text}]},
                           headers={"authorization": "Bearer sk-test"})


def recompute(model_dir: Path, record: dict) -> torch.Tensor:
    """transformers float32: log p(completion token t | everything before it), from the record's own ids."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompt = rec.token_ids(record, "prompt_token_ids")
    completion = rec.token_ids(record, "completion_token_ids")
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def gaps(model_dir: Path, record: dict) -> float:
    recorded = torch.tensor(rec.unpack_floats(record["completion_logprobs"]))
    return float((recompute(model_dir, record) - recorded).abs().max())


def admin(gw, method: str, path: str) -> dict:
    with open(gw.state["control_token"]) as fh:
        token = fh.read().strip()
    with httpx.Client(trust_env=False, timeout=10) as client:
        return client.request(method, gw.state["control_url"] + path,
                              headers={"x-polar-control-token": token}).json()


def test_1_1_after_a_reload_the_proxy_serves_and_records_the_new_weights(served, gateway, perturbed):
    gateway.mark()
    assert chat(gateway).status_code == 200
    (old,) = gateway.records()
    assert gaps(TINY, old) < 0.01 and old["weight_version"] is not None  # vLLM's own version ("default")
    proc = reload(served, perturbed, "step-1", proxy_json(gateway))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["weight_version"] == "step-1" and summary["proxies_held"] == 1
    print(f"reload: {summary['seconds']}")
    gateway.mark()
    assert chat(gateway).status_code == 200
    (new,) = gateway.records()
    assert new["weight_version"] == "step-1" and new["error"] is None
    assert gaps(perturbed, new) < 0.01  # the new checkpoint's logprobs ...
    assert gaps(TINY, new) > 0.1  # ... and not the old one's
    with open(served.run_file) as fh:
        info = json.load(fh)
    assert info["weights_dir"] == str(perturbed) and info["weight_version"] == "step-1"
    assert admin(gateway, "GET", "/admin/state")["held"] is False


def test_1_2_agents_streaming_through_a_reload_all_finish(served, gateway, perturbed):
    gateway.mark()
    done = threading.Event()
    results: list = []

    def agent() -> None:
        while True:
            last = done.is_set()
            try:
                resp = chat(gateway, stream=True, max_tokens=24)
                results.append((resp.status_code, resp.content, last))
            except httpx.HTTPError as exc:
                results.append((None, repr(exc).encode(), last))
            if last:
                return

    agents = [threading.Thread(target=agent, daemon=True) for _ in range(3)]
    for t in agents:
        t.start()
    assert wait_for(lambda: len(results) >= 3, timeout=120)  # streams are flowing
    proc = reload(served, TINY, "step-2", proxy_json(gateway))
    reloaded_at = time.time()
    done.set()
    for t in agents:
        t.join(180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"reload under load: {proc.stdout.strip()}")
    assert results and all(status == 200 and b"[DONE]" in body for status, body, _ in results), results[:3]
    records = gateway.records()
    assert len(records) == len(results) and all(r["error"] is None for r in records)
    assert {r["weight_version"] for r in records} <= {"step-1", "step-2", "default"}
    after = [r for r in records if r["t_start"] > reloaded_at]  # at least each agent's last call
    assert len(after) >= 3 and {r["weight_version"] for r in after} == {"step-2"}
    assert gaps(TINY, after[-1]) < 0.01


class PauseNeverEnds(BaseHTTPRequestHandler):
    """A dev-mode vLLM stand-in whose /pause never answers: the reloader stops between hold and release."""

    paused = threading.Event()
    forever = threading.Event()

    def log_message(self, *args) -> None:
        pass

    def _json(self, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json({"weight_version": "x"} if self.path.startswith("/weight_info") else {})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path.startswith("/pause"):
            self.paused.set()
            self.forever.wait(120)
            return  # the reloader is gone by now
        self._json({"choices": [{"logprobs": {"top_logprobs": [{"a": -0.5}]}}]})


def test_1_3_a_reloader_killed_between_hold_and_release_leaves_the_gateway_serving_after_the_hold_timeout(
        served, tmp_path):
    fake = ThreadingHTTPServer(("127.0.0.1", 0), PauseNeverEnds)
    fake.daemon_threads = True
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    run_file = tmp_path / "vllm.json"
    port = fake.server_address[1]
    run_file.write_text(json.dumps({"port": port, "base_url": f"http://127.0.0.1:{port}/v1", "model": "tiny",
                                    "model_dir": str(TINY), "weights_dir": str(TINY), "dev": True}))
    try:
        with start_gateway(served.base_url, str(tmp_path / "run"), str(tmp_path / "flows"),
                           sets=[PINNED, "polar_hold_timeout=3"]) as gw:
            reloader = subprocess.Popen([*VLLM, "reload", "--weights", str(TINY), "--version", "never",
                                         "--run-file", str(run_file), "--proxy-json", proxy_json(gw)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert PauseNeverEnds.paused.wait(60), reloader.communicate(timeout=5)
            assert admin(gw, "GET", "/admin/state")["held"] is True
            reloader.send_signal(signal.SIGKILL)  # between hold and release
            reloader.wait(10)
            gw.mark()
            resp = chat(gw)  # waits out the hold, then is served
            assert resp.status_code == 200
            state = admin(gw, "GET", "/admin/state")
            assert state["held"] is False and state["expired"] == 1
            (record,) = gw.records()
            assert record["error"] is None and record["weight_version"] != "never"
            assert "hold expired" in gw.log_text()
    finally:
        PauseNeverEnds.forever.set()
        fake.shutdown()
        fake.server_close()


@pytest.mark.parametrize("argv,needle", [
    (["--weights", "/nonexistent", "--version", "v"], "--weights"),
    (["--weights", str(TINY), "--version", ""], "--version"),
    (["--weights", str(TINY), "--version", "v", "--run-file", "/nonexistent/vllm.json"], "no vLLM run file"),
    (["--weights", str(TINY), "--version", "v", "--proxy-json", "/nonexistent/proxy.json"], "--proxy-json"),
])
def test_2_1_bad_input_is_one_line_and_exit_2(served, argv, needle):
    if "--run-file" not in argv:
        argv = [*argv, "--run-file", served.run_file]
    proc = subprocess.run([*VLLM, "reload", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_2_2_a_server_without_dev_mode_is_bad_input(tmp_path):
    run_file = tmp_path / "vllm.json"
    run_file.write_text(json.dumps({"port": 9, "model": "tiny", "model_dir": str(TINY), "dev": False}))
    proc = subprocess.run([*VLLM, "reload", "--weights", str(TINY), "--version", "v", "--run-file", str(run_file)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--dev" in proc.stderr


def test_2_3_old_weights_are_still_served_when_the_failure_comes_before_the_reload(served, gateway, tmp_path):
    # A proxy run file naming a live proxy with a wrong token: the hold is refused (403), nothing is reloaded.
    state = json.loads(Path(proxy_json(gateway)).read_text())
    bad_token = tmp_path / "token"
    bad_token.write_text("wrong\n")
    for p in state["proxies"]:
        p["control_token"] = str(bad_token)
    fake_json = tmp_path / "proxy.json"
    fake_json.write_text(json.dumps(state))
    before = json.loads(Path(served.run_file).read_text())
    proc = reload(served, TINY, "never", str(fake_json))
    assert proc.returncode == 1 and "old weights are still served" in proc.stderr, proc.stderr
    after = json.loads(Path(served.run_file).read_text())
    assert (after["weights_dir"], after["weight_version"]) == (before["weights_dir"], before["weight_version"])
    assert admin(gateway, "GET", "/admin/state")["held"] is False


def _vllm_script():
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("scripts_vllm", str(ROOT / "scripts" / "vllm"))
    spec = importlib.util.spec_from_loader("scripts_vllm", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.unit
def test_3_1_a_restart_of_the_same_server_serves_the_reloaded_weights_of_its_run_file(perturbed, tmp_path):
    vllm = _vllm_script()
    args = type("Args", (), {"dtype": "float32", "dev": True, "port": None, "run_file": "vllm.json"})()
    stale = {"model_dir": str(TINY), "dtype": "float32", "dev": True, "port": 8123, "weights_dir": str(perturbed),
             "weight_version": "step-9"}
    assert vllm.restored_weights(stale, TINY, args) == (perturbed, "step-9")
    assert vllm.restored_weights(None, TINY, args) == (TINY, None)  # no run file: the model's own weights
    assert vllm.restored_weights({**stale, "dtype": "bfloat16"}, TINY, args) == (TINY, None)  # another server
    assert vllm.restored_weights({**stale, "weights_dir": str(TINY)}, TINY, args) == (TINY, None)
    with pytest.raises(vllm.Fail, match="which is gone"):
        vllm.restored_weights({**stale, "weights_dir": str(tmp_path / "gone")}, TINY, args)
