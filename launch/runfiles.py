"""The run files as typed objects: proxy.json (one proxy or a fleet) and vllm.json (one server or a pool of
replicas). This module is the only code that reads or writes their JSON; everything else goes through
`ProxyRunFile` / `VllmRunFile` / `VllmPoolRunFile` (`read`, `write`; `read_vllm` for either vLLM kind).

A proxy run file keeps its first proxy's fields at the top level (readers written for one proxy) and lists every
proxy under `proxies`. A vLLM pool run file (`polar-vllm start --replicas N`, N > 1) lists its replicas under
`replicas` (run file, port, base URL, CUDA device) and gives the pool's `base_url` as the comma-separated list of
the replicas' base URLs (what the gateway's `polar_upstream` takes); each replica also has its own ordinary vLLM run
file beside it, `<stem>.r<i>.json` (vllm.json → vllm.r0.json, vllm.r1.json, …), which holds what one server's run
file holds (its weights and their version included: publication updates those, never the pool file). A pool run
file is never read as a single server's: `VllmRunFile.read` refuses it (RunFileError).
Writes are atomic (a temporary file, then a rename), so a reader never sees half a file.
Reading is lenient about what a file leaves out (older writers, hand-written test files) and strict about types.
Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.records.files import write_json_atomic


class RunFileError(ValueError):
    """A run file that exists but cannot be read as one (not JSON, not an object, a field of the wrong type)."""


def _load(path: str | os.PathLike) -> Any:
    """The JSON of `path`; None when there is no file; RunFileError when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RunFileError(f"{path}: {exc}") from None


def _dump(path: str | os.PathLike, doc: dict, indent: int) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc, indent=indent)


def _int(doc: dict, key: str, where: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RunFileError(f"{where}: {key} must be an integer (got {value!r})")
    return value


def _str(doc: dict, key: str, where: str) -> str | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise RunFileError(f"{where}: {key} must be a string (got {value!r})")
    return value


def remove(path: str | os.PathLike) -> bool:
    """Delete a run file; False when there was none."""
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


# ------------------------------------------------------------------------------------------------ proxy.json

@dataclass(frozen=True)
class ProxyEntry:
    """One proxy process: its pid (the leader of its own process group), its port, its log, its control endpoints
    (their own loopback URL and the file holding the token they require)."""

    pid: int | None
    port: int | None
    log: str | None = None
    control_url: str | None = None
    control_token: str | None = None

    def to_dict(self) -> dict:
        return {"pid": self.pid, "port": self.port, "log": self.log, "control_url": self.control_url,
                "control_token": self.control_token}

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> "ProxyEntry":
        if not isinstance(doc, dict):
            raise RunFileError(f"{where}: a proxy entry must be an object (got {doc!r})")
        return cls(pid=_int(doc, "pid", where), port=_int(doc, "port", where), log=_str(doc, "log", where),
                   control_url=_str(doc, "control_url", where), control_token=_str(doc, "control_token", where))


@dataclass(frozen=True)
class ProxyRunFile:
    """What `polar-proxy start` wrote: the fleet (`proxies`, at least one) and what they share."""

    proxies: tuple[ProxyEntry, ...]
    listen_host: str = "127.0.0.1"
    upstream: str | None = None
    flows: str | None = None
    ca_pem: str | None = None
    ca_bundle: str | None = None
    confdir: str | None = None

    def __post_init__(self):
        if not self.proxies:
            raise RunFileError("a proxy run file names at least one proxy")

    @property
    def first(self) -> ProxyEntry:
        return self.proxies[0]

    @property
    def pid(self) -> int | None:
        return self.first.pid

    @property
    def port(self) -> int | None:
        return self.first.port

    @property
    def log(self) -> str | None:
        return self.first.log

    def to_dict(self) -> dict:
        return {**self.first.to_dict(), "listen_host": self.listen_host, "upstream": self.upstream,
                "flows": self.flows, "ca_pem": self.ca_pem, "ca_bundle": self.ca_bundle, "confdir": self.confdir,
                "proxies": [p.to_dict() for p in self.proxies]}

    @classmethod
    def from_dict(cls, doc: Any, where: str = "proxy run file") -> "ProxyRunFile":
        if not isinstance(doc, dict):
            raise RunFileError(f"{where}: not a proxy run file (a JSON object)")
        listed = doc.get("proxies")
        if listed is not None and not isinstance(listed, list):
            raise RunFileError(f"{where}: proxies must be a list")
        proxies = tuple(ProxyEntry.from_dict(p, where) for p in (listed or [doc]))
        return cls(proxies=proxies, listen_host=_str(doc, "listen_host", where) or "127.0.0.1",
                   upstream=_str(doc, "upstream", where), flows=_str(doc, "flows", where),
                   ca_pem=_str(doc, "ca_pem", where), ca_bundle=_str(doc, "ca_bundle", where),
                   confdir=_str(doc, "confdir", where))

    def replace(self, **changes) -> "ProxyRunFile":
        return dataclasses.replace(self, **changes)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "ProxyRunFile | None":
        """The proxy run file at `path`; None when there is none; RunFileError when it is not one."""
        doc = _load(path)
        return None if doc is None else cls.from_dict(doc, str(path))

    def write(self, path: str | os.PathLike) -> None:
        _dump(path, self.to_dict(), indent=1)


# ------------------------------------------------------------------------------------------------ vllm.json

@dataclass(frozen=True)
class VllmRunFile:
    """What `polar-vllm start` wrote: the server (pid, the leader of its process group; port; base URL) and how it
    was started (model, dtype, dev mode, the weights it serves and their version, the arguments to start it
    again)."""

    pid: int | None = None
    port: int | None = None
    base_url: str | None = None
    model: str | None = None
    model_dir: str | None = None
    max_model_len: int | None = None
    logprobs_mode: str | None = None
    dtype: str | None = None
    dev: bool = False
    weights_dir: str | None = None
    weight_version: str | None = None
    start_args: tuple[str, ...] = ()
    log: str | None = None
    venv: str | None = None

    def to_dict(self) -> dict:
        doc = dataclasses.asdict(self)
        doc["start_args"] = list(self.start_args)
        return doc

    @classmethod
    def from_dict(cls, doc: Any, where: str = "vLLM run file") -> "VllmRunFile":
        if not isinstance(doc, dict):
            raise RunFileError(f"{where}: not a vLLM run file (a JSON object)")
        if "replicas" in doc:  # a pool's: its replicas each have their own run file
            raise RunFileError(f"{where}: a vLLM pool run file (its replicas each have their own run file)")
        args = doc.get("start_args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise RunFileError(f"{where}: start_args must be a list of strings")
        version = doc.get("weight_version")
        return cls(pid=_int(doc, "pid", where), port=_int(doc, "port", where), base_url=_str(doc, "base_url", where),
                   model=_str(doc, "model", where), model_dir=_str(doc, "model_dir", where),
                   max_model_len=_int(doc, "max_model_len", where), logprobs_mode=_str(doc, "logprobs_mode", where),
                   dtype=_str(doc, "dtype", where), dev=bool(doc.get("dev")),
                   weights_dir=_str(doc, "weights_dir", where),
                   weight_version=None if version is None else str(version), start_args=tuple(args),
                   log=_str(doc, "log", where), venv=_str(doc, "venv", where))

    def replace(self, **changes) -> "VllmRunFile":
        return dataclasses.replace(self, **changes)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "VllmRunFile | None":
        """The vLLM run file at `path`; None when there is none; RunFileError when it is not one."""
        doc = _load(path)
        return None if doc is None else cls.from_dict(doc, str(path))

    def write(self, path: str | os.PathLike) -> None:
        _dump(path, self.to_dict(), indent=2)


# ------------------------------------------------------------------------------------------------ vllm.json, a pool

@dataclass(frozen=True)
class VllmReplica:
    """One replica of a pool: its own run file (the truth about its pid, weights and version: a restart or a
    publication rewrites that file, never the pool's), its port, base URL, and the CUDA device it was given (None on
    a CPU build)."""

    run_file: str
    port: int | None = None
    base_url: str | None = None
    device: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> "VllmReplica":
        if not isinstance(doc, dict):
            raise RunFileError(f"{where}: a replica entry must be an object (got {doc!r})")
        run_file = _str(doc, "run_file", where)
        if not run_file:
            raise RunFileError(f"{where}: a replica entry names no run_file")
        return cls(run_file=run_file, port=_int(doc, "port", where), base_url=_str(doc, "base_url", where),
                   device=_str(doc, "device", where))


def replica_run_file(pool_path: str | os.PathLike, index: int) -> Path:
    """Where replica `index` of the pool at `pool_path` keeps its own run file: vllm.json → vllm.r0.json."""
    path = Path(pool_path)
    stem = path.stem if path.suffix == ".json" else path.name
    return path.with_name(f"{stem}.r{index}.json")


@dataclass(frozen=True)
class VllmPoolRunFile:
    """What `polar-vllm start --replicas N` wrote: the replicas (at least two), the served model, and the arguments
    that start the same pool again. `base_url` is the comma-separated list of the replicas' base URLs."""

    replicas: tuple[VllmReplica, ...]
    model: str | None = None
    model_dir: str | None = None
    dtype: str | None = None
    dev: bool = False
    start_args: tuple[str, ...] = ()

    def __post_init__(self):
        if len(self.replicas) < 2:
            raise RunFileError("a vLLM pool run file names at least two replicas")

    @property
    def base_urls(self) -> tuple[str, ...]:
        return tuple(r.base_url or f"http://127.0.0.1:{r.port}/v1" for r in self.replicas)

    @property
    def base_url(self) -> str:
        return ",".join(self.base_urls)

    @property
    def run_files(self) -> tuple[Path, ...]:
        return tuple(Path(r.run_file) for r in self.replicas)

    def to_dict(self) -> dict:
        return {"base_url": self.base_url, "model": self.model, "model_dir": self.model_dir, "dtype": self.dtype,
                "dev": self.dev, "start_args": list(self.start_args),
                "replicas": [r.to_dict() for r in self.replicas]}

    @classmethod
    def from_dict(cls, doc: Any, where: str = "vLLM pool run file") -> "VllmPoolRunFile":
        if not isinstance(doc, dict) or not isinstance(doc.get("replicas"), list):
            raise RunFileError(f"{where}: not a vLLM pool run file (a JSON object with a replicas list)")
        args = doc.get("start_args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise RunFileError(f"{where}: start_args must be a list of strings")
        return cls(replicas=tuple(VllmReplica.from_dict(r, where) for r in doc["replicas"]),
                   model=_str(doc, "model", where), model_dir=_str(doc, "model_dir", where),
                   dtype=_str(doc, "dtype", where), dev=bool(doc.get("dev")), start_args=tuple(args))

    def replace(self, **changes) -> "VllmPoolRunFile":
        return dataclasses.replace(self, **changes)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "VllmPoolRunFile | None":
        """The pool run file at `path`; None when there is none; RunFileError when it is not one."""
        doc = _load(path)
        return None if doc is None else cls.from_dict(doc, str(path))

    def write(self, path: str | os.PathLike) -> None:
        _dump(path, self.to_dict(), indent=2)


def read_vllm(path: str | os.PathLike) -> "VllmRunFile | VllmPoolRunFile | None":
    """The vLLM run file at `path`, a single server's or a pool's; None when there is none; RunFileError when it is
    neither."""
    doc = _load(path)
    if doc is None:
        return None
    if isinstance(doc, dict) and "replicas" in doc:
        return VllmPoolRunFile.from_dict(doc, str(path))
    return VllmRunFile.from_dict(doc, str(path))
